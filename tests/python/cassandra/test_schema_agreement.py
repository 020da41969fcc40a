"""Schema agreement on a three-node local cluster (`sluice cluster --nodes 3`, 127.0.0.1-3):
DDL through one node is answered once the change is applied there, the driver's agreement
wait after it ends well under a second, and every node's own system.local reports the same
schema_version shortly after."""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest
from cassandra.cluster import Cluster
from cassandra.policies import WhiteListRoundRobinPolicy

from conftest import free_port, sluice_bin

NODES = 3
AGREEMENT_BOUND_S = 1.0


def free_on_all_ips():
    for _ in range(100):
        port = free_port()
        ok = True
        for k in range(1, NODES + 1):
            with socket.socket() as s:
                try:
                    s.bind((f"127.0.0.{k}", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return port
    raise RuntimeError("no port free on every node's address")


@pytest.fixture(scope="module")
def local_cluster():
    directory = tempfile.mkdtemp(prefix="sluice-pytest-cluster-")
    cql, shard_aware, internode = free_on_all_ips(), free_on_all_ips(), free_on_all_ips()
    out_path = os.path.join(directory, "cluster.out")
    out = open(out_path, "wb")
    proc = subprocess.Popen(
        [sluice_bin(), "cluster", "--nodes", str(NODES), "--dir", directory,
         "--cql-port", str(cql), "--shard-aware-port", str(shard_aware),
         "--internode-port", str(internode), "--metrics-port", "off", "--num-tokens", "8",
         "--serve-arg=--durability=periodic"],
        stdout=out, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while b"connect with" not in open(out_path, "rb").read():
            assert proc.poll() is None, open(out_path, "rb").read().decode()
            assert time.monotonic() < deadline, "the cluster did not start within 120 s"
            time.sleep(0.1)
        yield cql
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.close()
        shutil.rmtree(directory, ignore_errors=True)


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
