#!/usr/bin/env python3
"""QUORUM writes/s (three rounds) and QUORUM reads/s through node 1 of a local cluster
(`sluice cluster --nodes N`): prepared INSERTs of 100-byte values, 64 in flight, COUNT per round.

Usage: .venv/cassandra/bin/python scripts/quorum_rate.py CQL_PORT NODES RF COUNT
Figures: docs/decisions/2026-11-26-the-coordinator.md."""
import sys, time
from cassandra.cluster import Cluster, ExecutionProfile, EXEC_PROFILE_DEFAULT
from cassandra.policies import WhiteListRoundRobinPolicy
from cassandra import ConsistencyLevel as CL
from cassandra.concurrent import execute_concurrent_with_args

port = int(sys.argv[1]); nodes = int(sys.argv[2]); rf = int(sys.argv[3]); count = int(sys.argv[4])
ips = [f"127.0.0.{i}" for i in range(1, nodes + 1)]
sessions = []
for ip in ips:
    p = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy([ip]), request_timeout=30)
    c = Cluster([ip], port=port, execution_profiles={EXEC_PROFILE_DEFAULT: p}, protocol_version=4)
    s = c.connect()
    s.execute("CREATE KEYSPACE IF NOT EXISTS qb WITH replication = "
              f"{{'class': 'SimpleStrategy', 'replication_factor': {rf}}}")
    s.execute("CREATE TABLE IF NOT EXISTS qb.t (pk int PRIMARY KEY, v text) "
              "WITH id = 3f0c1b2a-1111-4222-8333-944455556666")
    sessions.append(s)
s = sessions[0]
ins = s.prepare("INSERT INTO qb.t (pk, v) VALUES (?, ?)")
ins.consistency_level = CL.QUORUM
payload = "x" * 100
for rnd in range(3):
    args = [(1000000 * (rnd + 1) + i, payload) for i in range(count)]
    t0 = time.perf_counter()
    res = execute_concurrent_with_args(s, ins, args, concurrency=64, raise_on_first_error=False)
    dt = time.perf_counter() - t0
    failed = sum(1 for ok, _ in res if not ok)
    errs = {}
    for ok, r in res:
        if not ok:
            k = type(r).__name__ + ":" + str(r)[:150]
            errs[k] = errs.get(k, 0) + 1
    for k, n in list(errs.items())[:3]:
        print("  error", n, k)
    print(f"nodes={nodes} rf={rf} round={rnd} writes={count} failed={failed} seconds={dt:.2f} writes_per_s={count/dt:.0f}", flush=True)
sel = s.prepare("SELECT v FROM qb.t WHERE pk = ?")
sel.consistency_level = CL.QUORUM
args = [(i,) for i in range(count)]
t0 = time.perf_counter()
res = execute_concurrent_with_args(s, sel, args, concurrency=64, raise_on_first_error=False)
dt = time.perf_counter() - t0
failed = sum(1 for ok, _ in res if not ok)
print(f"nodes={nodes} rf={rf} quorum_reads={count} failed={failed} seconds={dt:.2f} reads_per_s={count/dt:.0f}", flush=True)
