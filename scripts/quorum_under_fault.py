#!/usr/bin/env python3
"""QUORUM reads (each checking its value) and writes through node 1 of a 3-node local cluster,
16 threads each, no driver retries; prints each second's outcomes for DURATION seconds, so that a
fault (kill -STOP / -CONT of a node's process) shows in them.

Usage: .venv/cassandra/bin/python scripts/quorum_under_fault.py CQL_PORT DURATION
Figures: docs/decisions/2026-11-26-the-coordinator.md."""
import sys, time, threading, collections
from cassandra.cluster import Cluster, ExecutionProfile, EXEC_PROFILE_DEFAULT
from cassandra.policies import WhiteListRoundRobinPolicy, FallthroughRetryPolicy
from cassandra import ConsistencyLevel as CL

port = int(sys.argv[1]); duration = float(sys.argv[2])
ips = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
sessions = []
for ip in ips:
    p = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy([ip]),
                         retry_policy=FallthroughRetryPolicy(), request_timeout=5)
    c = Cluster([ip], port=port, execution_profiles={EXEC_PROFILE_DEFAULT: p}, protocol_version=4)
    s = c.connect()
    s.execute("CREATE KEYSPACE IF NOT EXISTS fb WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3}")
    s.execute("CREATE TABLE IF NOT EXISTS fb.t (pk int PRIMARY KEY, v int) WITH id = 4a0c1b2a-1111-4222-8333-944455556666")
    sessions.append(s)
s = sessions[0]
ins = s.prepare("INSERT INTO fb.t (pk, v) VALUES (?, ?)"); ins.consistency_level = CL.QUORUM
sel = s.prepare("SELECT v FROM fb.t WHERE pk = ?"); sel.consistency_level = CL.QUORUM
for k in range(1000):
    s.execute(ins, (k, k))
start = time.time(); print("load start", start, flush=True)
counts = collections.defaultdict(lambda: collections.Counter())
lock = threading.Lock()
def worker(kind, wid):
    i = wid
    while time.time() - start < duration:
        k = i % 1000; i += 16
        sec = int(time.time() - start)
        try:
            if kind == "w":
                s.execute(ins, (k, k))
            else:
                r = s.execute(sel, (k,)).one()
                assert r is not None and r.v == k
            out = kind + "_ok"
        except Exception as e:
            out = kind + "_" + type(e).__name__
        with lock:
            counts[sec][out] += 1
threads = [threading.Thread(target=worker, args=(kind, w)) for kind in "wr" for w in range(16)]
for t in threads: t.start()
for t in threads: t.join()
for sec in sorted(counts):
    print(sec, dict(counts[sec]), flush=True)
