"""Schema agreement on a three-node local cluster (`sluice cluster --nodes 3`, 127.0.0.1-3):
DDL through one node is answered once the change is applied there, the driver's agreement
wait after it ends well under a second, and every node's own system.local reports the same
schema_version shortly after."""

import time

from cassandra.cluster import Cluster
from cassandra.policies import WhiteListRoundRobinPolicy

from conftest import LOCAL_CLUSTER_NODES as NODES

AGREEMENT_BOUND_S = 1.0


def connect(port, address="127.0.0.1", **options):
    cluster = Cluster(
        [address], port=port, protocol_version=4, connect_timeout=20,
        load_balancing_policy=WhiteListRoundRobinPolicy([address]), **options,
    )
    return cluster, cluster.connect()


def local_version(session):
    return session.execute("SELECT schema_version FROM system.local WHERE key = 'local'").one()[0]


def test_ddl_agreement_is_fast_and_every_node_reports_one_version(local_cluster):
    port = local_cluster
    cluster, s = connect(port)
    others = [connect(port, f"127.0.0.{k}") for k in range(2, NODES + 1)]
    try:
        assert len(cluster.metadata.all_hosts()) == NODES
        timings = []
        for statement in (
            "CREATE KEYSPACE agree WITH replication = "
            "{'class': 'SimpleStrategy', 'replication_factor': 3}",
            "CREATE TABLE agree.t (pk int PRIMARY KEY, v text)",
            "ALTER TABLE agree.t ADD w int",
        ):
            started = time.monotonic()
            result = s.execute(statement)
            took = time.monotonic() - started
            assert result.response_future.is_schema_agreed, statement
            started = time.monotonic()
            assert cluster.control_connection.wait_for_schema_agreement(wait_time=10)
            wait = time.monotonic() - started
            timings.append((statement.split(" (")[0], took, wait))
            assert took < AGREEMENT_BOUND_S, f"{statement}: {took:.3f} s"
            assert wait < AGREEMENT_BOUND_S, f"{statement}: agreement {wait:.3f} s"
            # Each node's own version (not the control node's view of its peers) agrees
            # within the bound.
            expected = local_version(s)
            deadline = time.monotonic() + AGREEMENT_BOUND_S
            for _, other in others:
                while local_version(other) != expected:
                    assert time.monotonic() < deadline, f"{statement}: versions differ"
                    time.sleep(0.02)
        for name, took, wait in timings:
            print(f"{name}: execute {took * 1000:.1f} ms, wait_for_schema_agreement {wait * 1000:.1f} ms")
        # The table is usable through the other nodes.
        for k, (_, other) in enumerate(others):
            other.execute("INSERT INTO agree.t (pk, v, w) VALUES (%s, 'x', 1)", (k,))
            assert other.execute("SELECT v FROM agree.t WHERE pk = %s", (k,)).one()[0] == "x"
    finally:
        for c, _ in others:
            c.shutdown()
        cluster.shutdown()


def test_a_driver_on_another_node_learns_of_ddl_from_its_schema_event(local_cluster):
    """The driver on node 2 issues no DDL and does not poll: only node 2's SCHEMA_CHANGE event
    (pushed when node 2 applies the change from the group) makes it re-read the schema."""
    port = local_cluster
    writer, s = connect(port)
    watcher, _ = connect(port, "127.0.0.2", schema_event_refresh_window=0.05)
    try:
        assert watcher.control_connection._connection.endpoint.address == "127.0.0.2"
        s.execute("CREATE KEYSPACE IF NOT EXISTS seen WITH replication = "
                  "{'class': 'SimpleStrategy', 'replication_factor': 3}")
        s.execute("CREATE TABLE seen.by_node_2 (pk int PRIMARY KEY)")
        created = time.monotonic()
        while "by_node_2" not in getattr(watcher.metadata.keyspaces.get("seen"), "tables", {}):
            assert time.monotonic() - created < 5, "no schema refresh from node 2's event"
            time.sleep(0.01)
        print(f"driver on node 2 saw the table after {(time.monotonic() - created) * 1000:.1f} ms")
    finally:
        watcher.shutdown()
        writer.shutdown()
