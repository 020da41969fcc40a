"""Schema agreement on a three-node local cluster (`sluice cluster --nodes 3`, 127.0.0.1-3):
DDL through one node is answered once the change is applied there, the driver's agreement
wait after it ends well under a second, and every node's own system.local reports the same
schema_version shortly after."""

import contextlib
import itertools
import logging
import time

from cassandra.cluster import Cluster, NoHostAvailable
from cassandra.policies import WhiteListRoundRobinPolicy
from cassandra.protocol import OverloadedErrorMessage

from conftest import LOCAL_CLUSTER_NODES as NODES

AGREEMENT_BOUND_S = 1.0
# How many times a connection may be refused by load shedding before the test fails.
SHED_RETRIES = 20


def connect(port, address="127.0.0.1", **options):
    """A driver whose control connection and requests use `address` only. A loaded node's
    admission may shed the control connection's first reads of the system tables, which fails
    the whole connect: it is tried again, bounded."""
    for _ in range(SHED_RETRIES):
        cluster = Cluster(
            [address], port=port, protocol_version=4, connect_timeout=20,
            load_balancing_policy=WhiteListRoundRobinPolicy([address]), **options,
        )
        try:
            return cluster, cluster.connect()
        except NoHostAvailable as e:
            cluster.shutdown()
            if not all(isinstance(error, OverloadedErrorMessage) for error in e.errors.values()):
                raise
            time.sleep(0.2)
    raise AssertionError(f"connecting to {address}: shed {SHED_RETRIES} times in a row")


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


class _ShedRefreshes(logging.Handler):
    """Counts the event-driven schema refreshes that a node's admission shed: the driver logs
    each at DEBUG and does not try it again."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record):
        if (record.getMessage().startswith("[control connection] Error refreshing schema")
                and record.exc_info
                and isinstance(record.exc_info[1], OverloadedErrorMessage)):
            self.count += 1


def _until_refreshed(seen, shed, retrigger, what, on_node_2):
    """Waits up to 5 s for `seen()`. A refresh that node 2's admission shed on a loaded machine
    is lost to the driver: `retrigger()` then makes another change, so that node 2 sends
    another event (bounded). Without a shed refresh, 5 s without `seen()` fail the test."""
    for _ in range(SHED_RETRIES):
        shed_before = shed.count
        started = time.monotonic()
        while not seen():
            if shed.count > shed_before:
                break
            if time.monotonic() - started >= 5:
                raise AssertionError(f"no schema refresh from node 2's event for {what}; "
                                     f"node 2 has {on_node_2()}")
            time.sleep(0.01)
        else:
            return time.monotonic() - started
        retrigger()
    raise AssertionError(f"{what}: node 2's refreshes shed {SHED_RETRIES} times in a row")


def test_a_driver_on_another_node_learns_of_ddl_from_its_schema_event(local_cluster):
    """The driver on node 2 issues no DDL and does not poll: only node 2's SCHEMA_CHANGE events
    (pushed when node 2 applies each change from the group) make it re-read the schema.

    The keyspace's event is awaited before the table is created: the driver runs its event
    refreshes on a pool of two threads, and a table refresh that completes before the refresh
    of its new keyspace is dropped (the driver has no keyspace to add it to), so creating both
    at once would test the driver's ordering, not the server's events."""
    port = local_cluster
    shed = _ShedRefreshes()
    logger = logging.getLogger("cassandra.cluster")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(shed)
    # The writer does not refresh on events, so that every shed refresh counted is the watcher's.
    writer, s = connect(port, schema_event_refresh_window=-1)
    watcher, watched = connect(port, "127.0.0.2", schema_event_refresh_window=0.05)
    try:
        assert watcher.control_connection._connection.endpoint.address == "127.0.0.2"

        def on_node_2(query):
            return lambda: sorted(r[0] for r in watched.execute(query))

        s.execute("CREATE KEYSPACE IF NOT EXISTS seen WITH replication = "
                  "{'class': 'SimpleStrategy', 'replication_factor': 3}")
        def refresh_keyspace():
            # Only the table is under test: the keyspace may be read on request.
            with contextlib.suppress(Exception):
                watcher.refresh_keyspace_metadata("seen")

        _until_refreshed(
            lambda: "seen" in watcher.metadata.keyspaces, shed, refresh_keyspace,
            "the keyspace", on_node_2("SELECT keyspace_name FROM system_schema.keyspaces"))
        s.execute("CREATE TABLE seen.by_node_2 (pk int PRIMARY KEY)")
        changes = itertools.count()
        took = _until_refreshed(
            lambda: "by_node_2" in getattr(watcher.metadata.keyspaces.get("seen"), "tables", {}),
            shed,
            lambda: s.execute(f"ALTER TABLE seen.by_node_2 WITH comment = '{next(changes)}'"),
            "the table", on_node_2(
                "SELECT table_name FROM system_schema.tables WHERE keyspace_name = 'seen'"))
        print(f"driver on node 2 saw the table {took * 1000:.1f} ms after its last event; "
              f"{shed.count} refreshes shed by node 2")
    finally:
        logger.removeHandler(shed)
        logger.setLevel(level)
        watcher.shutdown()
        writer.shutdown()
