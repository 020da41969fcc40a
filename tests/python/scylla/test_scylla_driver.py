"""The Python scylla-driver: connects shard-aware, sees the shard info, basic operations."""

import time

import pytest
from cassandra.cluster import Cluster


@pytest.fixture(scope="module")
def cluster(node):
    c = Cluster(["127.0.0.1"], port=node.port, protocol_version=4, connect_timeout=20)
    s = c.connect()
    s.default_timeout = 30
    yield c, s
    c.shutdown()


def test_sharding_info_is_received(cluster, node):
    c, s = cluster
    host = c.metadata.all_hosts()[0]
    deadline = time.time() + 20
    info = None
    while time.time() < deadline:
        pool = s._pools.get(host)
        info = getattr(host, "sharding_info", None)
        if info is not None and pool is not None and len(pool._connections) == node.shards:
            break
        time.sleep(0.2)
    assert info is not None, "driver found no sharding info"
    assert info.shards_count == node.shards
    assert info.shard_aware_port == node.shard_aware_port
    # One connection per shard, each on its shard.
    assert sorted(pool._connections.keys()) == list(range(node.shards))


def test_basic_operations(cluster):
    _, s = cluster
    s.execute("CREATE KEYSPACE IF NOT EXISTS sd WITH replication = "
              "{'class': 'NetworkTopologyStrategy', 'replication_factor': 1}")
    s.execute("CREATE TABLE IF NOT EXISTS sd.t (pk bigint, ck bigint, v blob, PRIMARY KEY (pk, ck))")
    ins = s.prepare("INSERT INTO sd.t (pk, ck, v) VALUES (?, ?, ?)")
    for pk in range(20):
        for ck in range(5):
            s.execute(ins, (pk, ck, bytes([pk, ck])))
    sel = s.prepare("SELECT ck, v FROM sd.t WHERE pk = ?")
    for pk in range(20):
        rows = list(s.execute(sel, (pk,)))
        assert [r.ck for r in rows] == list(range(5))
        assert rows[2].v == bytes([pk, 2])
    s.execute("DELETE FROM sd.t WHERE pk = 3")
    assert s.execute(sel, (3,)).one() is None


def test_prepared_statements_route_to_owning_shard(cluster, node):
    _, s = cluster
    s.execute("CREATE KEYSPACE IF NOT EXISTS sd WITH replication = "
              "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    s.execute("CREATE TABLE IF NOT EXISTS sd.r (pk int PRIMARY KEY, v int)")
    ins = s.prepare("INSERT INTO sd.r (pk, v) VALUES (?, ?)")
    before = node.metric_sum("sluice_cross_shard_forwards_total")
    for pk in range(200):
        s.execute(ins, (pk, pk))
    after = node.metric_sum("sluice_cross_shard_forwards_total")
    # Token- and shard-aware routing: every prepared single-partition write lands on the
    # shard that owns it, so none is forwarded.
    assert after - before == 0
