"""Per-partition rate limiting with the Python scylla-driver (issue 3): the driver negotiates
SCYLLA_RATE_LIMIT_ERROR and raises its typed RateLimitReached; the rejected writes are not
retried and leave no data behind; other partitions are unaffected."""

import pytest
from cassandra import RateLimitReached, OperationType

LIMIT = 10


@pytest.fixture(scope="module")
def session(rate_limited_session):
    with rate_limited_session("rl_scylla", LIMIT) as s:
        yield s


def test_hot_partition_gets_rate_limit_reached_and_no_data(session, node, hammer_hot_partition):
    def check(e):
        assert e.op_type == OperationType.Write
        assert e.rejected_by_coordinator

    rejected = hammer_hot_partition(session, "rl_scylla", LIMIT, RateLimitReached, check)
    assert node.metric_sum("sluice_rate_limit_rejected_total", keyspace="rl_scylla", table="t",
                           op="write") == len(rejected)
