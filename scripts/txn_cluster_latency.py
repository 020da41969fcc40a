"""Latency of LWT, transactions and SERIAL reads through each coordinator of a 3-node cluster
(the transaction log on the metadata Raft group), one request at a time, no contention.

Usage: SLUICE_BIN=target/debug/sluice .venv/cassandra/bin/python scripts/txn_cluster_latency.py [N] [forwarded]
Starts three `sluice serve` processes on 127.0.0.1-3 (as tests/python/cassandra/
test_transactions_cluster.py does), runs N (default 100) of each operation through each node
and prints the median and p90 in milliseconds (node 1 starts the group, so it usually leads).
With `forwarded`: RF 1, every operation through node 1, on N partitions node 1 holds and on N
it does not (those forwarded to their replica)."""

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python", "cassandra"))

from test_transactions_cluster import NODES, ClusterNodes, pinned  # noqa: E402


def timed(fn, n):
    out = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t) * 1000)
    out.sort()
    return statistics.median(out), out[int(len(out) * 0.9) - 1]


def forwarded(nodes, n):
    """Through node 1 at RF 1: partitions it holds beside partitions it forwards."""
    import struct

    from cassandra import ConsistencyLevel

    cluster, s = pinned(nodes, 1)
    s.execute("CREATE KEYSPACE lat1 WITH replication = "
              "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    s.execute("CREATE TABLE lat1.t (k int PRIMARY KEY, v int)")
    cluster.refresh_schema_metadata()
    mine, other = [], []
    for k in range(100_000):
        replicas = cluster.metadata.get_replicas("lat1", struct.pack(">i", k))
        (mine if replicas[0].address == nodes.ip(1) else other).append(k)
        if len(mine) >= n and len(other) >= n:
            break
    ins = s.prepare("INSERT INTO lat1.t (k, v) VALUES (?, 0) IF NOT EXISTS")
    cas = s.prepare("UPDATE lat1.t SET v = ? WHERE k = ? IF v = ?")
    read = s.prepare("SELECT v FROM lat1.t WHERE k = ?")
    read.consistency_level = ConsistencyLevel.SERIAL
    for name, keys in (("held by node 1", mine[:n]), ("forwarded", other[:n])):
        results = {
            "INSERT IF NOT EXISTS": timed(lambda i: s.execute(ins, (keys[i],)), n),
            "UPDATE IF v = ?": timed(lambda i: s.execute(cas, (1, keys[i], 0)), n),
            "SELECT at SERIAL": timed(lambda i: s.execute(read, (keys[i],)), n),
        }
        for what, (p50, p90) in results.items():
            print(f"node 1, {name}: {what}: p50 {p50:.1f} ms, p90 {p90:.1f} ms")
    cluster.shutdown()


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    if sys.argv[2:] == ["forwarded"]:
        nodes = ClusterNodes()
        try:
            forwarded(nodes, n)
        finally:
            nodes.stop()
        return
    from cassandra import ConsistencyLevel
    from cassandra.query import SimpleStatement

    nodes = ClusterNodes()
    try:
        cluster, s = pinned(nodes, 1)
        s.execute("CREATE KEYSPACE lat WITH replication = "
                  "{'class': 'SimpleStrategy', 'replication_factor': 3}")
        s.execute("CREATE TABLE lat.t (k int PRIMARY KEY, v int)")
        cluster.shutdown()
        for index in range(1, NODES + 1):
            c, s = pinned(nodes, index)
            cas = s.prepare("UPDATE lat.t SET v = ? WHERE k = ? IF v = ?")
            ins = s.prepare("INSERT INTO lat.t (k, v) VALUES (?, 0) IF NOT EXISTS")
            read = SimpleStatement("SELECT v FROM lat.t WHERE k = %s",
                                   consistency_level=ConsistencyLevel.SERIAL)
            txn = s.prepare("BEGIN TRANSACTION LET a = (SELECT v FROM lat.t WHERE k = ?); "
                            "SELECT a.v; IF a.v = ? THEN UPDATE lat.t SET v = ? WHERE k = ?; "
                            "END IF COMMIT TRANSACTION")
            base = index * 100_000
            results = {
                "INSERT IF NOT EXISTS": timed(lambda i: s.execute(ins, (base + i,)), n),
                "UPDATE IF v = ?": timed(lambda i: s.execute(cas, (1, base + i, 0)), n),
                "SELECT at SERIAL": timed(lambda i: s.execute(read, (base + i,)), n),
                "transaction (LET, IF, UPDATE)": timed(
                    lambda i: s.execute(txn, (base + i, 1, 2, base + i)), n),
            }
            for what, (p50, p90) in results.items():
                print(f"node {index}: {what}: p50 {p50:.1f} ms, p90 {p90:.1f} ms")
            c.shutdown()
        print(f"commits: {[nodes.metric(i, 'sluice_txn_log_commits_total') for i in (1, 2, 3)]}")
    finally:
        nodes.stop()


if __name__ == "__main__":
    main()
