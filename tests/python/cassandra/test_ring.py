"""A node's cluster identity (cluster name, data center, rack, host id, tokens) as drivers
read it from system.local, its survival across a restart, and the server's replica lists
in system_views.token_replicas against the Python driver's token map."""

import random
import signal

import pytest
from cassandra.cluster import Cluster
from cassandra.metadata import Murmur3Token

from conftest import Node

NUM_TOKENS = 8


@pytest.fixture(scope="module")
def ring_node():
    n = Node(
        shards=1,
        extra=["--cluster-name", "Ring Test", "--dc", "dc-east", "--rack", "rack7",
               "--num-tokens", str(NUM_TOKENS)],
    )
    try:
        yield n
    finally:
        n.stop()


def connect(node):
    cluster = Cluster(["127.0.0.1"], port=node.port, protocol_version=4, connect_timeout=20)
    return cluster, cluster.connect()


def local_identity(session):
    row = session.execute(
        "SELECT cluster_name, data_center, rack, host_id, tokens, partitioner FROM system.local"
    ).one()
    return row


def test_system_local_shows_the_configured_identity(ring_node):
    cluster, s = connect(ring_node)
    try:
        row = local_identity(s)
        assert row.cluster_name == "Ring Test"
        assert row.data_center == "dc-east"
        assert row.rack == "rack7"
        assert row.partitioner.endswith("Murmur3Partitioner")
        tokens = sorted(int(t) for t in row.tokens)
        assert len(tokens) == NUM_TOKENS and len(set(tokens)) == NUM_TOKENS
        assert cluster.metadata.cluster_name == "Ring Test"
        (host,) = cluster.metadata.all_hosts()
        assert host.host_id == row.host_id
        assert host.datacenter == "dc-east" and host.rack == "rack7"
        ring = [t.value for t in cluster.metadata.token_map.ring]
        assert ring == tokens, "the driver's token ring is the node's tokens"
    finally:
        cluster.shutdown()


def test_server_replicas_equal_the_drivers_token_map(ring_node):
    cluster, s = connect(ring_node)
    try:
        s.execute("CREATE KEYSPACE ring_simple WITH replication = "
                  "{'class': 'SimpleStrategy', 'replication_factor': 3}")
        s.execute("CREATE KEYSPACE ring_nts WITH replication = "
                  "{'class': 'NetworkTopologyStrategy', 'dc-east': 2}")
        cluster.refresh_schema_metadata()
        token_map = cluster.metadata.token_map
        ring = [t.value for t in token_map.ring]
        rng = random.Random(26)
        probes = [rng.randrange(-2**63 + 1, 2**63) for _ in range(200)]
        probes += ring + [t + 1 for t in ring if t < 2**63 - 1] + [-2**63 + 1, 2**63 - 1]
        lookup = s.prepare(
            "SELECT replicas FROM system_views.token_replicas "
            "WHERE keyspace_name = ? AND token_value = ?"
        )
        compared = 0
        for ks in ("ring_simple", "ring_nts"):
            for token in probes:
                row = s.execute(lookup, (ks, token)).one()
                server = [str(a) for a in row.replicas]
                driver = [h.address for h in token_map.get_replicas(ks, Murmur3Token(token))]
                assert server == driver, (ks, token)
                compared += 1
        assert compared == 2 * len(probes)
        # One node: every replica list is that node.
        assert server == ["127.0.0.1"]
        # An unknown keyspace has no row; a read without the key is refused.
        assert s.execute(lookup, ("no_such_ks", 1)).one() is None
        with pytest.raises(Exception, match="read by key"):
            s.execute("SELECT * FROM system_views.token_replicas WHERE keyspace_name = 'ring_nts'")
    finally:
        cluster.shutdown()


def test_identity_survives_a_restart(ring_node):
    cluster, s = connect(ring_node)
    try:
        before = local_identity(s)
    finally:
        cluster.shutdown()
    ring_node.proc.send_signal(signal.SIGTERM)
    assert ring_node.proc.wait(timeout=20) == 0
    assert ring_node._start(), "restarted on the same data directory"
    cluster, s = connect(ring_node)
    try:
        after = local_identity(s)
        assert after.host_id == before.host_id
        assert sorted(after.tokens) == sorted(before.tokens)
        assert after.cluster_name == before.cluster_name
    finally:
        cluster.shutdown()
