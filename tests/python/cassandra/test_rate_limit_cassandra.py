"""Per-partition rate limiting with the plain cassandra-driver (issue 3): it does not know
SCYLLA_RATE_LIMIT_ERROR, so a rejection arrives as Config_error (ConfigurationException),
which its default retry policy does not retry; the rejected writes leave no data behind."""

import pytest
from cassandra.protocol import ConfigurationException

LIMIT = 10


@pytest.fixture(scope="module")
def session(rate_limited_session):
    with rate_limited_session("rl_cass", LIMIT) as s:
        yield s


def test_hot_partition_gets_a_non_retried_config_error(session, node, hammer_hot_partition):
    def check(e):
        assert "rate limit" in str(e).lower()

    rejected = hammer_hot_partition(session, "rl_cass", LIMIT, ConfigurationException, check)
    assert node.metric_sum("sluice_errors_total", code="config_error") >= len(rejected)


def test_invalid_options_are_configuration_errors(session):
    for bad in ("{'max_writes_per_second': -1}", "{'max_reads_per_second': 0.5}",
                "{'max_writes': 3}"):
        with pytest.raises(ConfigurationException):
            session.execute("ALTER TABLE rl_cass.t WITH per_partition_rate_limit = " + bad)
