#!/usr/bin/env python3
"""Hints across a coordinator restart, timed: three `sluice serve` nodes on 127.0.0.1-3 (one
shard each, periodic durability), a keyspace of RF 3; node 3 killed (-9); COUNT prepared QUORUM
INSERTs of 100-byte values through node 1 (64 in flight); node 1 stopped (SIGTERM, or kill -9
one second after the writes with `kill`) and started again; node 3 started; then the time until
node 1 has replayed every hint, and the rows node 3 alone holds at ONE.

Usage: .venv/cassandra/bin/python scripts/hints_restart.py BIN DIR COUNT [term|kill|kill0|off]
(`kill0`: kill -9 as soon as the last write is answered; `off`: hinted handoff off, the write
rate only). Figures: docs/decisions/2026-11-27-hints-on-disk.md."""
import os, re, signal, socket, subprocess, sys, time, urllib.request
from cassandra.cluster import Cluster, ExecutionProfile, EXEC_PROFILE_DEFAULT
from cassandra.policies import FallthroughRetryPolicy, WhiteListRoundRobinPolicy
from cassandra import ConsistencyLevel as CL, Unavailable
from cassandra.query import SimpleStatement
from cassandra.concurrent import execute_concurrent_with_args

BIN, DIR, COUNT = sys.argv[1], sys.argv[2], int(sys.argv[3])
MODE = sys.argv[4] if len(sys.argv) > 4 else "term"
CQL, SHARD, INTERNODE, METRICS = 9452, 19452, 7452, 9652
procs = {}


def start(i):
    args = [BIN, "serve", "--listen", f"127.0.0.{i}:{CQL}", "--shard-aware-port", str(SHARD),
            "--internode-listen", f"127.0.0.{i}:{INTERNODE}",
            "--metrics-listen", f"127.0.0.{i}:{METRICS}", "--shards", "1", "--num-tokens", "8",
            "--durability", "periodic", "--data-dir", f"{DIR}/node{i}"]
    if i > 1:
        args += ["--seeds", f"127.0.0.1:{INTERNODE}"]
    if MODE == "off":
        args += ["--hinted-handoff", "off"]
    log = open(f"{DIR}/node{i}.log", "a")
    t0 = time.perf_counter()
    procs[i] = subprocess.Popen(args, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    while True:
        assert procs[i].poll() is None, f"node {i} exited"
        try:
            socket.create_connection((f"127.0.0.{i}", CQL), timeout=0.1).close()
            return time.perf_counter() - t0
        except OSError:
            time.sleep(0.02)
        assert time.perf_counter() - t0 < 60, f"node {i} did not start"


def metric(i, name):
    text = urllib.request.urlopen(f"http://127.0.0.{i}:{METRICS}/metrics", timeout=5).read().decode()
    m = re.search(rf"^{name} (\d+)$", text, re.M)
    return int(m.group(1)) if m else None


def session(i):
    p = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy([f"127.0.0.{i}"]),
                         retry_policy=FallthroughRetryPolicy(), request_timeout=30)
    c = Cluster([f"127.0.0.{i}"], port=CQL, execution_profiles={EXEC_PROFILE_DEFAULT: p},
                protocol_version=4)
    return c, c.connect()


def stop_all():
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM); p.wait()


import atexit
atexit.register(stop_all)
os.makedirs(DIR, exist_ok=True)
for i in (1, 2, 3):
    start(i)
c1, s1 = session(1)
s1.execute("CREATE KEYSPACE IF NOT EXISTS hb WITH replication = "
           "{'class': 'SimpleStrategy', 'replication_factor': 3}")
s1.execute("CREATE TABLE IF NOT EXISTS hb.t (pk int PRIMARY KEY, v text)")
def peers():
    try:
        return len(list(s1.execute("SELECT peer FROM system.peers")))
    except Exception:
        return 0


while peers() < 2:
    time.sleep(0.2)
procs[3].kill(); procs[3].wait()
probe = SimpleStatement("INSERT INTO hb.t (pk, v) VALUES (-1, 'probe')", consistency_level=CL.ALL)
while True:
    try:
        s1.execute(probe)
    except Unavailable:
        break
    except Exception:
        pass
    time.sleep(0.2)
ins = s1.prepare("INSERT INTO hb.t (pk, v) VALUES (?, ?)")
ins.consistency_level = CL.QUORUM
t0 = time.perf_counter()
res = execute_concurrent_with_args(s1, ins, [(i, "x" * 100) for i in range(COUNT)],
                                   concurrency=64, raise_on_first_error=False)
dt = time.perf_counter() - t0
failed = sum(1 for ok, _ in res if not ok)
errs = {}
for ok, r in res:
    if not ok:
        k = type(r).__name__ + ":" + str(r)[:120]
        errs[k] = errs.get(k, 0) + 1
for k, n in list(errs.items())[:3]:
    print("  error", n, k)
acked = {i for i, (ok, _) in enumerate(res) if ok}
print(f"node 1 sees node 3 down", flush=True)
print(f"mode={MODE} writes={COUNT} failed={failed} seconds={dt:.2f} writes_per_s={COUNT/dt:.0f}")
if MODE == "kill0":
    # At once: what the last batch had not written yet is lost.
    procs[1].kill(); procs[1].wait()
else:
    time.sleep(0.5)
stored = metric(1, "sluice_hints_stored_total") if MODE != "kill0" else COUNT
if MODE != "kill0":
    print(f"node1 hints_stored={stored} held={metric(1, 'sluice_hints_held')} "
          f"disk_bytes={metric(1, 'sluice_hint_disk_bytes')} dropped={metric(1, 'sluice_hints_dropped_total')}")
c1.shutdown()
if MODE == "off":
    sys.exit(0)
t0 = time.perf_counter()
if MODE == "kill":
    time.sleep(1.0)
    procs[1].kill(); procs[1].wait()
elif MODE == "kill0":
    pass
else:
    procs[1].send_signal(signal.SIGTERM); procs[1].wait()
print(f"node1 stopped ({MODE}) in {time.perf_counter() - t0:.2f}s, rc={procs[1].returncode}")
print(f"node1 restarted, CQL open in {start(1):.2f}s; "
      f"held after restart={metric(1, 'sluice_hints_held')} "
      f"disk_bytes={metric(1, 'sluice_hint_disk_bytes')}")
t_start = time.perf_counter()
start(3)
while True:
    held = metric(1, "sluice_hints_held")
    if held == 0:
        break
    assert time.perf_counter() - t_start < 600, f"hints still held: {held}"
    time.sleep(0.1)
took = time.perf_counter() - t_start
replayed = metric(1, "sluice_hints_replayed_total")
print(f"replayed={replayed} in {took:.2f}s from node 3's start ({replayed/took:.0f}/s) "
      f"dropped={metric(1, 'sluice_hints_dropped_total')} disk_bytes={metric(1, 'sluice_hint_disk_bytes')}")
c3, s3 = session(3)
sel = s3.prepare("SELECT v FROM hb.t WHERE pk = ?")
sel.consistency_level = CL.ONE
res = execute_concurrent_with_args(s3, sel, [(i,) for i in range(COUNT)], concurrency=64,
                                   raise_on_first_error=False)
held3 = {i for i, (ok, r) in enumerate(res) if ok and len(list(r)) == 1}
missing = sorted(acked - held3)
print(f"node 3 alone at ONE holds {len(held3)} of {COUNT} rows; acknowledged and missing: "
      f"{len(missing)}" + (f" (pk {missing[0]} to {missing[-1]})" if missing else ""))
c3.shutdown()
