"""Per-partition rate limiting with the Python scylla-driver (issue 3): the driver negotiates
SCYLLA_RATE_LIMIT_ERROR and raises its typed RateLimitReached; the rejected writes are not
retried and leave no data behind; other partitions are unaffected."""

import pytest
from cassandra import RateLimitReached, OperationType
from cassandra.cluster import Cluster

LIMIT = 10


@pytest.fixture(scope="module")
def session(node):
    c = Cluster(["127.0.0.1"], port=node.port, protocol_version=4, connect_timeout=20)
    s = c.connect()
    s.default_timeout = 30
    s.execute("CREATE KEYSPACE IF NOT EXISTS rl_scylla WITH replication = "
              "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    s.execute("CREATE TABLE IF NOT EXISTS rl_scylla.t (pk int, ck int, v int, PRIMARY KEY (pk, ck)) "
              "WITH per_partition_rate_limit = {'max_writes_per_second': %d}" % LIMIT)
    yield s
    c.shutdown()


def test_hot_partition_gets_rate_limit_reached_and_no_data(session, node):
    ins = session.prepare("INSERT INTO rl_scylla.t (pk, ck, v) VALUES (?, ?, ?)")
    executes_before = node.metric_sum("sluice_requests_total", opcode="execute")
    accepted, rejected = set(), set()
    for ck in range(300):
        try:
            session.execute(ins, (1, ck, ck))
            accepted.add(ck)
        except RateLimitReached as e:
            assert e.op_type == OperationType.Write
            assert e.rejected_by_coordinator
            rejected.add(ck)
    executes = node.metric_sum("sluice_requests_total", opcode="execute") - executes_before
    assert executes == 300, "a rate-limited write must not be retried"
    assert rejected, "300 writes to one partition: none rejected"
    assert len(accepted) >= LIMIT
    stored = {r.ck for r in session.execute("SELECT ck FROM rl_scylla.t WHERE pk = 1")}
    assert stored == accepted, "a rejected write left data behind"
    # Other partitions are unaffected.
    for pk in range(2, 40):
        session.execute(ins, (pk, 0, 0))
    assert node.metric_sum("sluice_rate_limit_rejected_total", keyspace="rl_scylla", table="t",
                           op="write") == len(rejected)
