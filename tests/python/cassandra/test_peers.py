"""system.peers / system.peers_v2 as the Python driver reads them, on one node given a ring of
three (two pretended peers with nothing listening, `--test-only-fake-peers`): the driver
discovers three hosts with the server's tokens, marks the absent ones down, and the session
keeps working through the real node."""

import time

import pytest
from cassandra.cluster import Cluster
from cassandra.metadata import Murmur3Token

from conftest import Node

FAKE_PEERS = ("127.0.0.202", "127.0.0.203")


@pytest.fixture(scope="module")
def node_with_peers():
    n = Node(shards=1, extra=["--num-tokens", "4",
                              "--test-only-fake-peers", ",".join(FAKE_PEERS)])
    try:
        yield n
    finally:
        n.stop()


def test_peers_tables_list_the_other_nodes(node_with_peers):
    cluster = Cluster(["127.0.0.1"], port=node_with_peers.port, protocol_version=4,
                      connect_timeout=5)
    s = cluster.connect()
    try:
        peers = {str(r.peer): r for r in s.execute("SELECT * FROM system.peers")}
        assert sorted(peers) == sorted(FAKE_PEERS)
        local = s.execute("SELECT host_id, schema_version, tokens FROM system.local").one()
        for addr, r in peers.items():
            assert str(r.rpc_address) == addr
            assert r.data_center == "datacenter1" and r.rack == "rack1"
            assert r.schema_version == local.schema_version
            assert len(r.tokens) == 4 and r.host_id != local.host_id
        v2 = {str(r.peer): r for r in s.execute("SELECT * FROM system.peers_v2")}
        assert sorted(v2) == sorted(FAKE_PEERS)
        for addr, r in v2.items():
            assert str(r.native_address) == addr
            assert r.native_port == node_with_peers.port
            # A pretended peer listens on this node's internode port, at its own address.
            assert r.peer_port == node_with_peers.internode_port
            assert r.tokens == peers[addr].tokens

        hosts = {h.address: h for h in cluster.metadata.all_hosts()}
        assert sorted(hosts) == sorted(("127.0.0.1",) + FAKE_PEERS)
        driver_ring = sorted(t.value for t in cluster.metadata.token_map.ring)
        server_ring = sorted(int(t) for t in local.tokens)
        server_ring += [int(t) for r in peers.values() for t in r.tokens]
        assert driver_ring == sorted(server_ring), "the driver's ring is the server's"
        # Nothing listens at the fake peers: the driver marks them down.
        deadline = time.time() + 20
        while time.time() < deadline and any(hosts[a].is_up for a in FAKE_PEERS):
            time.sleep(0.1)
        assert not any(hosts[a].is_up for a in FAKE_PEERS)
        assert hosts["127.0.0.1"].is_up

        # The session keeps working through the real node, and the server's replica lists
        # are the driver's for a three-node ring.
        s.execute("CREATE KEYSPACE peers_rf3 WITH replication = "
                  "{'class': 'SimpleStrategy', 'replication_factor': 3}")
        s.execute("CREATE TABLE peers_rf3.t (k int PRIMARY KEY, v int)")
        for k in range(20):
            s.execute("INSERT INTO peers_rf3.t (k, v) VALUES (%s, %s)", (k, k * 10))
        assert sorted(r.v for r in s.execute("SELECT v FROM peers_rf3.t")) == [
            k * 10 for k in range(20)]
        cluster.refresh_schema_metadata()
        lookup = s.prepare("SELECT replicas FROM system_views.token_replicas "
                           "WHERE keyspace_name = 'peers_rf3' AND token_value = ?")
        for token in driver_ring + [t + 1 for t in driver_ring] + [0, -2**63 + 1]:
            server = [str(a) for a in s.execute(lookup, (token,)).one().replicas]
            driver = [h.address for h in cluster.metadata.token_map.get_replicas(
                "peers_rf3", Murmur3Token(token))]
            assert server == driver, token
            assert len(server) == 3
    finally:
        cluster.shutdown()
