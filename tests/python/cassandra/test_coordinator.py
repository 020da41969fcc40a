"""Replication as the Python driver sees it: `sluice cluster --nodes 3` on 127.0.0.1-3, a
keyspace of replication factor 3, writes at QUORUM through the driver's default (token-aware)
routing; every node alone then holds every row (a read at ONE pinned to it), a read at ALL
succeeds, and a read at ANY is refused as Cassandra refuses it."""

import time

import pytest
from cassandra import ConsistencyLevel, InvalidRequest
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
from cassandra.policies import WhiteListRoundRobinPolicy
from cassandra.query import SimpleStatement

from conftest import LOCAL_CLUSTER_NODES as NODES

TABLE_ID = "1c2d3e4f-5a6b-4c7d-8e9f-a0b1c2d3e4f5"


def pinned(ip, port):
    """A session whose every statement goes to `ip`."""
    profile = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy([ip]),
                               request_timeout=10)
    cluster = Cluster([ip], port=port, protocol_version=4,
                      execution_profiles={EXEC_PROFILE_DEFAULT: profile})
    return cluster, cluster.connect()


def test_quorum_writes_reach_every_replica(local_cluster):
    port = local_cluster
    ips = [f"127.0.0.{i}" for i in range(1, NODES + 1)]
    pins = [pinned(ip, port) for ip in ips]
    try:
        # Each node runs the DDL (IF NOT EXISTS), so each has the table before the writes.
        for _, s in pins:
            s.execute("CREATE KEYSPACE IF NOT EXISTS coord WITH replication = "
                      "{'class': 'SimpleStrategy', 'replication_factor': 3}")
            s.execute("CREATE TABLE IF NOT EXISTS coord.t (pk int PRIMARY KEY, v text) "
                      f"WITH id = {TABLE_ID}")
        routed = Cluster([ips[0]], port=port, protocol_version=4)
        try:
            s = routed.connect()
            deadline = time.time() + 20
            while len(routed.metadata.all_hosts()) < NODES and time.time() < deadline:
                time.sleep(0.1)
            assert sorted(h.address for h in routed.metadata.all_hosts()) == ips
            insert = s.prepare("INSERT INTO coord.t (pk, v) VALUES (?, ?)")
            insert.consistency_level = ConsistencyLevel.QUORUM
            for k in range(100):
                s.execute(insert, (k, f"v{k}"))
            select = s.prepare("SELECT v FROM coord.t WHERE pk = ?")
            select.consistency_level = ConsistencyLevel.ALL
            for k in range(0, 100, 7):
                assert s.execute(select, (k,)).one().v == f"v{k}"
            with pytest.raises(InvalidRequest, match="ANY ConsistencyLevel"):
                s.execute(SimpleStatement("SELECT v FROM coord.t WHERE pk = 1",
                                          consistency_level=ConsistencyLevel.ANY))
        finally:
            routed.shutdown()
        # Every live replica got every write: each node alone, at ONE, has all 100 rows.
        for ip, (_, s) in zip(ips, pins):
            one = s.prepare("SELECT v FROM coord.t WHERE pk = ?")
            one.consistency_level = ConsistencyLevel.ONE
            missing = [k for k in range(100) if s.execute(one, (k,)).one() is None]
            assert missing == [], (ip, missing)
    finally:
        for c, _ in pins:
            c.shutdown()
