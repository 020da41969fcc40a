"""The same aggregates on Sluice and on Cassandra over the same 60,000 rows, compared.

Loads 300 partitions of 200 rows into ks.big on both (with `load`), then runs each
statement on both and prints SAME or DIFFERENT with the answers (first rows of long ones).

    python3 -m venv venv && venv/bin/pip install cassandra-driver
    ANCHOR=/tmp/cass CQL_PORT=19142 STORAGE_PORT=17000 JMX_PORT=17199 \
        ../shared/anchors/cassandra/start.sh
    target/release/sluice serve --listen 127.0.0.1:19542 --metrics-listen off \
        --data-dir /tmp/cmp-data --shard-aware-port off &
    venv/bin/python scripts/aggregates_vs_cassandra.py 19542 19142 load
"""
import sys
import time
from cassandra.cluster import Cluster, ExecutionProfile, EXEC_PROFILE_DEFAULT
from cassandra.query import BatchStatement, BatchType, SimpleStatement

ports = {"sluice": int(sys.argv[1]), "cassandra": int(sys.argv[2])}
P, R = 300, 200
load = sys.argv[3] == "load"


def v_of(pk, ck):
    return (pk * 7919 + ck * 104729) % 2001 - 1000


def d_of(pk, ck):
    return v_of(pk, ck) * 0.1 + 1e-3


queries = [
    "SELECT count(*), sum(v), avg(v), min(v), max(v), sum(d), avg(d) FROM ks.big",
    "SELECT pk, count(*), sum(v), sum(d), avg(d) FROM ks.big GROUP BY pk",
    "SELECT count(*), sum(v), sum(d) FROM ks.big WHERE v > 500 ALLOW FILTERING",
    "SELECT count(*) FROM ks.big PER PARTITION LIMIT 3",
    "SELECT count(*), sum(d), avg(d), min(d), max(d) FROM ks.big WHERE pk = 7",
    "SELECT pk, ck, count(*) FROM ks.big WHERE pk = 7 GROUP BY pk, ck LIMIT 5",
    "SELECT pk, count(*), sum(d) FROM ks.big GROUP BY pk PER PARTITION LIMIT 2",
    "SELECT pk, ck, count(*) FROM ks.big GROUP BY pk, ck PER PARTITION LIMIT 2",
    "SELECT pk, ck FROM ks.big PER PARTITION LIMIT 3",
    "SELECT pk, ck, v FROM ks.big WHERE v > 990 ALLOW FILTERING",
    "SELECT count(*), sum(v) FROM ks.big WHERE pk IN (1, 2, 3, 250)",
    "SELECT max(ck), min(v), avg(d) FROM ks.big WHERE token(pk) > 0",
]
results = {}
for name, port in ports.items():
    prof = ExecutionProfile(request_timeout=120)
    c = Cluster(["127.0.0.1"], port=port, protocol_version=4,
                execution_profiles={EXEC_PROFILE_DEFAULT: prof})
    s = c.connect()
    if load:
        s.execute("CREATE KEYSPACE IF NOT EXISTS ks WITH replication = "
                  "{'class': 'SimpleStrategy', 'replication_factor': 1}")
        s.execute("CREATE TABLE IF NOT EXISTS ks.big (pk int, ck int, v int, d double, PRIMARY KEY (pk, ck))")
        ins = s.prepare("INSERT INTO ks.big (pk, ck, v, d) VALUES (?, ?, ?, ?)")
        t0 = time.time()
        for pk in range(P):
            for start in range(0, R, 50):
                b = BatchStatement(batch_type=BatchType.UNLOGGED)
                for ck in range(start, start + 50):
                    b.add(ins, (pk, ck, v_of(pk, ck), d_of(pk, ck)))
                for attempt in range(50):
                    try:
                        s.execute(b)
                        break
                    except Exception as e:  # noqa: BLE001
                        time.sleep(0.1)
                else:
                    raise RuntimeError("load failed")
        print(f"{name}: loaded {P * R} rows in {time.time() - t0:.1f} s", flush=True)
    results[name] = []
    for q in queries:
        try:
            rows = [tuple(r) for r in s.execute(SimpleStatement(q, fetch_size=5000))]
        except Exception as e:  # noqa: BLE001
            rows = f"ERROR {type(e).__name__}: {e}"
        results[name].append(rows)
    c.shutdown()

for i, q in enumerate(queries):
    a, b = results["sluice"][i], results["cassandra"][i]
    same = a == b
    print(f"{'SAME' if same else 'DIFFERENT'}: {q}")
    if isinstance(a, list) and len(a) > 3:
        print(f"  {len(a)} rows; first: sluice {a[0]} / cassandra {b[0] if isinstance(b, list) and b else b}")
        if not same and isinstance(b, list):
            diffs = [(x, y) for x, y in zip(a, b) if x != y]
            print(f"  {len(diffs)} differing rows, e.g. {diffs[:2]}; lengths {len(a)} / {len(b)}")
    else:
        print(f"  sluice    {a}\n  cassandra {b}")
