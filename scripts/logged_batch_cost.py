"""Cost of a 2-partition LOGGED batch on 3 nodes against the same batch UNLOGGED (the path a
logged batch took before it went through the transaction log), in one run on one cluster.

Usage: SLUICE_BIN=target/debug/sluice .venv/cassandra/bin/python scripts/logged_batch_cost.py [N] [ROUNDS]
Starts three `sluice serve` processes on 127.0.0.1-3 (as tests/python/cassandra/
test_transactions_cluster.py does), keyspaces of RF 1 and RF 2, and through node 1 at ONE
(RF 1) and QUORUM (RF 2) runs ROUNDS (default 3) alternating blocks of N (default 200)
batches of each kind, one at a time, each batch on two partitions with different replica
sets; then the same with 32 batches in flight. Prints the median and p90 in milliseconds and
the rate of acknowledged batches (with the errors of the others, such as the admission's
Overloaded), per kind, with node 1's `sluice_txn_log_commits_total` before and after."""

import os
import statistics
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python", "cassandra"))

from test_transactions_cluster import ClusterNodes, pinned  # noqa: E402


def pairs(cluster, ks, n):
    """n pairs of keys whose replica sets differ."""
    out, last = [], None
    for k in range(1_000_000):
        replicas = {h.address for h in cluster.metadata.get_replicas(ks, struct.pack(">i", k))}
        if last is not None and replicas != last[1]:
            out.append((last[0], k))
            last = None
            if len(out) == n:
                return out
        else:
            last = (k, replicas)
    raise RuntimeError("not enough pairs")


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    from cassandra import ConsistencyLevel
    from cassandra.concurrent import execute_concurrent
    from cassandra.query import BatchStatement, BatchType

    nodes = ClusterNodes()
    try:
        cluster, s = pinned(nodes, 1)
        for ks, rf in (("lb1", 1), ("lb2", 2)):
            s.execute(f"CREATE KEYSPACE {ks} WITH replication = "
                      f"{{'class': 'SimpleStrategy', 'replication_factor': {rf}}}")
            s.execute(f"CREATE TABLE {ks}.t (k int PRIMARY KEY, v text)")
        cluster.refresh_schema_metadata()
        for ks, cl in (("lb1", ConsistencyLevel.ONE), ("lb2", ConsistencyLevel.QUORUM)):
            ins = s.prepare(f"INSERT INTO {ks}.t (k, v) VALUES (?, ?)")
            keys = pairs(cluster, ks, n)

            def make(kind, pair, v):
                b = BatchStatement(batch_type=kind, consistency_level=cl)
                b.add(ins, (pair[0], v))
                b.add(ins, (pair[1], v))
                return b

            kinds = (("LOGGED", BatchType.LOGGED), ("UNLOGGED", BatchType.UNLOGGED))
            lat = {name: [] for name, _ in kinds}
            rate = {name: [] for name, _ in kinds}
            errors = {name: {} for name, _ in kinds}
            commits_before = nodes.metric(1, "sluice_txn_log_commits_total")
            for r in range(rounds):
                for name, kind in kinds:
                    for i, pair in enumerate(keys):
                        t = time.perf_counter()
                        s.execute(make(kind, pair, f"{name}-{r}-{i}"))
                        lat[name].append((time.perf_counter() - t) * 1000)
                for name, kind in kinds:
                    batches = [(make(kind, pair, f"{name}-c{r}-{i}"), None)
                               for i, pair in enumerate(keys)]
                    t = time.perf_counter()
                    results = execute_concurrent(s, batches, concurrency=32,
                                                 raise_on_first_error=False)
                    took = time.perf_counter() - t
                    done = sum(1 for ok, _ in results if ok)
                    for ok, e in results:
                        if not ok:
                            kind_of = type(e).__name__
                            errors[name][kind_of] = errors[name].get(kind_of, 0) + 1
                    rate[name].append(done / took)
            commits_after = nodes.metric(1, "sluice_txn_log_commits_total")
            for name, _ in kinds:
                xs = sorted(lat[name])
                p50 = statistics.median(xs)
                p90 = xs[int(len(xs) * 0.9) - 1]
                rates = ", ".join(f"{x:.0f}" for x in rate[name])
                print(f"{ks} at {ConsistencyLevel.value_to_name[cl]}: {name}: one at a time "
                      f"p50 {p50:.2f} ms, p90 {p90:.2f} ms ({len(xs)} batches); "
                      f"32 in flight: {rates} acknowledged batches/s per round, "
                      f"refused: {errors[name] or 'none'}")
            print(f"{ks}: node 1 sluice_txn_log_commits_total {commits_before} -> {commits_after}")
        cluster.shutdown()
    finally:
        nodes.stop()


if __name__ == "__main__":
    main()
