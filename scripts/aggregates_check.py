"""Aggregates over a big table through a real node, checked against a full paged scan.

Loads PARTITIONS x ROWS rows into ks.big (with `load`), pages through the table, then runs
COUNT(*), SUM, GROUP BY and a filtered COUNT, each while a second client reads single rows
in a loop and /metrics is polled for the shard event-loop lag. Prints each answer next to
what the scan saw, the aggregate's time, the reader's p99/max and the largest lag seen.

    python3 -m venv venv && venv/bin/pip install cassandra-driver
    target/release/sluice serve --listen 127.0.0.1:19542 --metrics-listen 127.0.0.1:19580 \
        --data-dir /tmp/agg-data --shards 1 --durability periodic --shard-aware-port off &
    venv/bin/python scripts/aggregates_check.py 19542 19580 5000 200 load
"""
import re
import sys
import threading
import time
import urllib.request

from cassandra.cluster import Cluster, ExecutionProfile, EXEC_PROFILE_DEFAULT
from cassandra.query import BatchStatement, BatchType, SimpleStatement

port = int(sys.argv[1])
metrics_port = int(sys.argv[2])
partitions = int(sys.argv[3])
rows = int(sys.argv[4])
load = sys.argv[5] == "load"


def v_of(pk, ck):
    return (pk * 7919 + ck * 104729) % 2001 - 1000


profile = ExecutionProfile(request_timeout=120)
cluster = Cluster(["127.0.0.1"], port=port, protocol_version=4,
                  execution_profiles={EXEC_PROFILE_DEFAULT: profile})
s = cluster.connect()
def settle(futures):
    for b, f in futures:
        try:
            f.result()
        except Exception:  # noqa: BLE001  (Overloaded under a busy machine: retry)
            for _ in range(50):
                time.sleep(0.05)
                try:
                    s.execute(b)
                    break
                except Exception:  # noqa: BLE001
                    pass
            else:
                raise


if load:
    s.execute("CREATE KEYSPACE IF NOT EXISTS ks WITH replication = "
              "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    s.execute("CREATE TABLE IF NOT EXISTS ks.big (pk int, ck int, v int, PRIMARY KEY (pk, ck))")
    ins = s.prepare("INSERT INTO ks.big (pk, ck, v) VALUES (?, ?, ?)")
    t0 = time.time()
    futures = []
    for pk in range(partitions):
        for start in range(0, rows, 100):
            b = BatchStatement(batch_type=BatchType.UNLOGGED)
            for ck in range(start, min(rows, start + 100)):
                b.add(ins, (pk, ck, v_of(pk, ck)))
            futures.append((b, s.execute_async(b)))
            if len(futures) >= 16:
                settle(futures)
                futures = []
    settle(futures)
    print(f"loaded {partitions * rows} rows in {time.time() - t0:.1f} s", flush=True)

expected_count = partitions * rows
expected_sum = sum(v_of(pk, ck) for pk in range(partitions) for ck in range(rows))

# Full paged scan (what the aggregates must agree with).
t0 = time.time()
n = 0
scan_sum = 0
per_pk = {}
overloaded = 0
state = None
while True:
    for attempt in range(100):
        try:
            rs = s.execute(SimpleStatement("SELECT pk, v FROM ks.big", fetch_size=5000),
                           paging_state=state)
            break
        except Exception:  # noqa: BLE001  (Overloaded on a busy machine: retry the page)
            overloaded += 1
            time.sleep(0.05)
    else:
        raise RuntimeError("scan page kept failing")
    for r in rs.current_rows:
        n += 1
        scan_sum += r.v
        c = per_pk.get(r.pk, (0, 0))
        per_pk[r.pk] = (c[0] + 1, c[1] + r.v)
    state = rs.paging_state
    if state is None:
        break
print(f"paged scan ({overloaded} pages retried after Overloaded): {n} rows, sum(v) {scan_sum} in {time.time() - t0:.1f} s "
      f"(expected {expected_count}, {expected_sum})", flush=True)

# A second client reading single partitions, and a /metrics poller, during each aggregate.
stop = threading.Event()
lat = []
reader_errors = []
lag_max = {}


def reader():
    c2 = Cluster(["127.0.0.1"], port=port, protocol_version=4)
    s2 = c2.connect()
    q = s2.prepare("SELECT v FROM ks.big WHERE pk = ? AND ck = 0")
    i = 0
    while not stop.is_set():
        t = time.perf_counter()
        try:
            s2.execute(q, (i % partitions,))
        except Exception:  # noqa: BLE001  (Overloaded: counted, and the read is retried)
            reader_errors.append(1)
            continue
        lat.append(time.perf_counter() - t)
        i += 1
    c2.shutdown()


def poller():
    pat = re.compile(r'^sluice_loop_lag_microseconds\{shard="(\d+)"\} (-?\d+)', re.M)
    while not stop.is_set():
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2).read().decode()
        except Exception as e:  # noqa: BLE001
            print("metrics:", e)
            time.sleep(0.01)
            continue
        for shard, us in pat.findall(text):
            lag_max[shard] = max(lag_max.get(shard, 0), int(us))
        time.sleep(0.002)


def measured(q):
    reader_errors.clear()
    lat.clear()
    lag_max.clear()
    stop.clear()
    ts = [threading.Thread(target=reader), threading.Thread(target=poller)]
    for t in ts:
        t.start()
    time.sleep(1.0)
    before = len(lat)
    t0 = time.time()
    try:
        if q is None:
            time.sleep(2.0)
            res = None
        else:
            res = list(s.execute(SimpleStatement(q, fetch_size=5000)))
    except Exception as e:  # noqa: BLE001
        res = e
    took = time.time() - t0
    during = sorted(lat[before:])
    time.sleep(0.3)
    stop.set()
    for t in ts:
        t.join()
    if during:
        p99 = during[min(len(during) - 1, int(len(during) * 0.99))]
        rd = f"reader during it: {len(during)} reads, p99 {p99 * 1000:.1f} ms, max {during[-1] * 1000:.1f} ms, {len(reader_errors)} errors"
    else:
        rd = "reader during it: no reads completed"
    print(f"{q}\n  took {took:.2f} s; {rd}; max loop lag per shard (us) {lag_max}", flush=True)
    return res


measured(None)
r = measured("SELECT count(*) FROM ks.big")
print("  answer:", r if isinstance(r, Exception) else r[0][0], "expected", expected_count, flush=True)
r = measured("SELECT count(*), sum(v) FROM ks.big")
if not isinstance(r, Exception):
    print("  answer:", tuple(r[0]), "scan", (n, scan_sum), flush=True)
else:
    print("  answer:", r)
r = measured("SELECT pk, count(*), sum(v) FROM ks.big GROUP BY pk")
if not isinstance(r, Exception):
    got = {row.pk: (row.count, row.system_sum_v) for row in r}
    print(f"  answer: {len(got)} groups; equal to the paged scan's: {got == per_pk}", flush=True)
else:
    print("  answer:", r)
r = measured("SELECT count(*) FROM ks.big WHERE v > 500 ALLOW FILTERING")
exp = sum(1 for pk in range(partitions) for ck in range(rows) if v_of(pk, ck) > 500)
print("  answer:", r if isinstance(r, Exception) else r[0][0], "expected", exp, flush=True)
measured(None)
cluster.shutdown()
