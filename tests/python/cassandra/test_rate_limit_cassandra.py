"""Per-partition rate limiting with the plain cassandra-driver (issue 3): it does not know
SCYLLA_RATE_LIMIT_ERROR, so a rejection arrives as Config_error (ConfigurationException),
which its default retry policy does not retry; the rejected writes leave no data behind."""

import pytest
from cassandra.cluster import Cluster
from cassandra.protocol import ConfigurationException

LIMIT = 10


@pytest.fixture(scope="module")
def session(node):
    c = Cluster(["127.0.0.1"], port=node.port, protocol_version=4, connect_timeout=20)
    s = c.connect()
    s.default_timeout = 30
    s.execute("CREATE KEYSPACE IF NOT EXISTS rl_cass WITH replication = "
              "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    s.execute("CREATE TABLE IF NOT EXISTS rl_cass.t (pk int, ck int, v int, PRIMARY KEY (pk, ck)) "
              "WITH per_partition_rate_limit = {'max_writes_per_second': %d}" % LIMIT)
    yield s
    c.shutdown()


def test_hot_partition_gets_a_non_retried_config_error(session, node):
    ins = session.prepare("INSERT INTO rl_cass.t (pk, ck, v) VALUES (?, ?, ?)")
    executes_before = node.metric_sum("sluice_requests_total", opcode="execute")
    accepted, rejected = set(), set()
    for ck in range(300):
        try:
            session.execute(ins, (1, ck, ck))
            accepted.add(ck)
        except ConfigurationException as e:
            assert "rate limit" in str(e).lower()
            rejected.add(ck)
    executes = node.metric_sum("sluice_requests_total", opcode="execute") - executes_before
    assert executes == 300, "a rate-limited write must not be retried"
    assert rejected, "300 writes to one partition: none rejected"
    assert len(accepted) >= LIMIT
    stored = {r.ck for r in session.execute("SELECT ck FROM rl_cass.t WHERE pk = 1")}
    assert stored == accepted, "a rejected write left data behind"
    for pk in range(2, 40):
        session.execute(ins, (pk, 0, 0))
    assert node.metric_sum("sluice_errors_total", code="config_error") >= len(rejected)


def test_invalid_options_are_configuration_errors(session):
    for bad in ("{'max_writes_per_second': -1}", "{'max_reads_per_second': 0.5}",
                "{'max_writes': 3}"):
        with pytest.raises(ConfigurationException):
            session.execute("ALTER TABLE rl_cass.t WITH per_partition_rate_limit = " + bad)
