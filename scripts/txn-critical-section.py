#!/usr/bin/env python3
"""Critical-section and lock-wait time of two-partition transactions carrying 1 KB and 1 MB
values, read from the server's GET /metrics (sluice_txn_*). Starts its own node per size.

    SLUICE_BIN=target/debug/sluice .venv/cassandra/bin/python scripts/txn-critical-section.py
"""
import os, sys, threading, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from conftest import Node
from cassandra.cluster import Cluster

TXN = """BEGIN TRANSACTION
  LET a = (SELECT ver FROM docs.d WHERE id = ?);
  LET b = (SELECT ver FROM docs.d WHERE id = ?);
  SELECT a.ver, b.ver;
  UPDATE docs.d SET body = ?, ver = ? WHERE id = ?;
  UPDATE docs.d SET body = ?, ver = ? WHERE id = ?;
COMMIT TRANSACTION"""

def quantiles(node, name):
    out = {}
    for line in node.metrics().splitlines():
        if line.startswith(name):
            k, v = line.rsplit(" ", 1)
            out[k[len(name):]] = float(v)
    return out

for size, count, clients in [(1024, 2000, 4), (1 << 20, 100, 2)]:
    node = Node(shards=2)
    try:
        cl = Cluster(["127.0.0.1"], port=node.port, protocol_version=4, connect_timeout=20)
        s = cl.connect(); s.default_timeout = 60
        s.execute("CREATE KEYSPACE docs WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}")
        s.execute("CREATE TABLE docs.d (id int PRIMARY KEY, ver bigint, body blob)")
        p = s.prepare(TXN)
        body = b"x" * size
        def run(n):
            for i in range(count // clients):
                a, b = (n * 1000 + i) % 997, (n * 1000 + i + 500) % 997
                s.execute(p, (a, b, body, i, a, body, i, b))
        t0 = time.time()
        ts = [threading.Thread(target=run, args=(n,)) for n in range(clients)]
        [t.start() for t in ts]; [t.join() for t in ts]
        dt = time.time() - t0
        cs = quantiles(node, "sluice_txn_critical_section_seconds")
        lw = quantiles(node, "sluice_txn_lock_wait_seconds")
        print(f"value {size} B x2, {count} txns, {clients} clients, {count/dt:.0f} txn/s")
        print("  critical section", cs)
        print("  lock wait", lw)
        cl.shutdown()
    finally:
        node.stop()
