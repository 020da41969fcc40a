"""Reads through any node as a round-robin (not token-aware) Python driver sees them:
`sluice cluster --nodes 3` on 127.0.0.1-3, keyspaces of replication factor 1 and 2, so that
most partitions are not on the node a request lands on. Every single-partition read (at ONE
and QUORUM, paged), every paged SELECT without a partition key and COUNT(*) answers every row,
with no driver retries (a request the node's admission sheds under the shared machine's load,
"Server is overloaded", is asked again, bounded; the old "not a replica" refusal is not); each
node's system.peers shows the other two at its own schema version. LWT (`INSERT ... IF NOT
EXISTS`, `UPDATE ... IF`, a conditional batch), SERIAL reads and one-partition transactions through every node, RF 1,
run on the partition's replica and answer as it does."""

import time

from cassandra import ConsistencyLevel
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
from cassandra.policies import FallthroughRetryPolicy, RoundRobinPolicy
from cassandra.protocol import OverloadedErrorMessage
from cassandra.query import SimpleStatement

from conftest import LOCAL_CLUSTER_NODES as NODES

PARTITIONS = 30
ROWS = 3
SHED_RETRIES = 20


def shed_tolerant(run):
    """`run()`, asked again while the answer is the admission's load shedding."""
    for _ in range(SHED_RETRIES):
        try:
            return run()
        except OverloadedErrorMessage as e:
            if "Server is overloaded" not in str(e):
                raise
            time.sleep(0.05)
    raise AssertionError(f"shed {SHED_RETRIES} times in a row")


def test_round_robin_reads_answer_every_row(local_cluster):
    port = local_cluster
    ips = [f"127.0.0.{i}" for i in range(1, NODES + 1)]
    profile = ExecutionProfile(load_balancing_policy=RoundRobinPolicy(),
                               retry_policy=FallthroughRetryPolicy(), request_timeout=10)
    cluster = Cluster(ips, port=port, protocol_version=4,
                      execution_profiles={EXEC_PROFILE_DEFAULT: profile})
    s = cluster.connect()
    try:
        deadline = time.time() + 20
        while len([h for h in cluster.metadata.all_hosts() if h.is_up]) < NODES:
            assert time.time() < deadline, "three hosts up"
            time.sleep(0.1)
        want = sorted((pk, ck, f"{pk}-{ck}") for pk in range(PARTITIONS) for ck in range(ROWS))
        for ks, rf, cl in (("rr1", 1, ConsistencyLevel.ONE), ("rr2", 2, ConsistencyLevel.QUORUM)):
            s.execute(f"CREATE KEYSPACE {ks} WITH replication = "
                      f"{{'class': 'SimpleStrategy', 'replication_factor': {rf}}}")
            s.execute(f"CREATE TABLE {ks}.t (pk int, ck int, v text, PRIMARY KEY (pk, ck))")
            insert = s.prepare(f"INSERT INTO {ks}.t (pk, ck, v) VALUES (?, ?, ?)")
            insert.consistency_level = cl
            for row in want:
                shed_tolerant(lambda: s.execute(insert, row))
            by_pk = s.prepare(f"SELECT ck, v FROM {ks}.t WHERE pk = ?")
            by_pk.consistency_level = cl
            by_pk.fetch_size = 2
            # Three rounds: each partition's read lands on each node in turn.
            for _ in range(NODES):
                for pk in range(PARTITIONS):
                    got = shed_tolerant(lambda: [(r.ck, r.v) for r in s.execute(by_pk, (pk,))])
                    assert got == [(ck, f"{pk}-{ck}") for ck in range(ROWS)], (ks, pk)
            for _ in range(NODES):
                scan = SimpleStatement(f"SELECT pk, ck, v FROM {ks}.t", consistency_level=cl,
                                       fetch_size=7)
                got = shed_tolerant(lambda: [(r.pk, r.ck, r.v) for r in s.execute(scan)])
                assert len(got) == len(want), (ks, len(got))
                assert sorted(got) == want, ks
                count = shed_tolerant(lambda: s.execute(SimpleStatement(
                    f"SELECT COUNT(*) FROM {ks}.t", consistency_level=cl)).one()[0])
                assert count == len(want), (ks, count)
        # Each node's peers report their own schema version, which is the one every node has.
        for ip in ips:
            pinned = ExecutionProfile(load_balancing_policy=_Only(ip), request_timeout=10)
            cluster.add_execution_profile(f"on-{ip}", pinned)
            local = s.execute("SELECT schema_version FROM system.local",
                              execution_profile=f"on-{ip}").one()[0]
            peers = list(s.execute("SELECT peer, schema_version FROM system.peers",
                                   execution_profile=f"on-{ip}"))
            assert len(peers) == NODES - 1
            assert all(p.schema_version == local for p in peers), (ip, peers, local)
    finally:
        cluster.shutdown()


LWT_PARTITIONS = 12


def test_round_robin_lwt_serial_reads_and_transactions_through_every_node(local_cluster):
    port = local_cluster
    ips = [f"127.0.0.{i}" for i in range(1, NODES + 1)]
    profile = ExecutionProfile(load_balancing_policy=RoundRobinPolicy(),
                               retry_policy=FallthroughRetryPolicy(), request_timeout=10)
    cluster = Cluster(ips, port=port, protocol_version=4,
                      execution_profiles={EXEC_PROFILE_DEFAULT: profile})
    s = cluster.connect()
    try:
        deadline = time.time() + 20
        while len([h for h in cluster.metadata.all_hosts() if h.is_up]) < NODES:
            assert time.time() < deadline, "three hosts up"
            time.sleep(0.1)
        for ip in ips:
            cluster.add_execution_profile(f"on-{ip}", ExecutionProfile(
                load_balancing_policy=_Only(ip), retry_policy=FallthroughRetryPolicy(),
                request_timeout=10))
        s.execute("CREATE KEYSPACE lw1 WITH replication = "
                  "{'class': 'SimpleStrategy', 'replication_factor': 1}")
        s.execute("CREATE TABLE lw1.t (pk int PRIMARY KEY, v int)")
        insert = s.prepare("INSERT INTO lw1.t (pk, v) VALUES (?, 0) IF NOT EXISTS")
        update = s.prepare("UPDATE lw1.t SET v = ? WHERE pk = ? IF v = ?")
        serial = s.prepare("SELECT v FROM lw1.t WHERE pk = ?")
        serial.consistency_level = ConsistencyLevel.SERIAL
        txn = s.prepare("""BEGIN TRANSACTION
              LET r = (SELECT v FROM lw1.t WHERE pk = ?);
              SELECT r.v;
              IF r.v = 1 THEN
                UPDATE lw1.t SET v = 2 WHERE pk = ?;
              END IF
            COMMIT TRANSACTION""")
        txn.consistency_level = ConsistencyLevel.QUORUM
        batch = s.prepare("BEGIN BATCH UPDATE lw1.t SET v = 3 WHERE pk = ? IF v = 2; APPLY BATCH")

        def on(ip, stmt, args):
            return shed_tolerant(lambda: s.execute(stmt, args, execution_profile=f"on-{ip}").one())

        # Every node coordinates its own set of partitions; at RF 1 about two thirds of them
        # live on another node.
        for n, ip in enumerate(ips):
            for pk in range(n * 100, n * 100 + LWT_PARTITIONS):
                assert on(ip, insert, (pk,))[0] is True, (ip, pk)
                row = on(ip, insert, (pk,))
                assert (row[0], row.v) == (False, 0), (ip, pk, row)
                assert on(ip, update, (1, pk, 0))[0] is True, (ip, pk)
                row = on(ip, update, (1, pk, 0))
                assert (row[0], row.v) == (False, 1), (ip, pk, row)
                assert on(ip, serial, (pk,)).v == 1, (ip, pk)
                assert on(ip, txn, (pk, pk))[0] == 1, (ip, pk)
                assert on(ip, serial, (pk,)).v == 2, (ip, pk)
                assert on(ip, batch, (pk,))[0] is True, (ip, pk)
                assert on(ip, batch, (pk,))[0] is False, (ip, pk)
        # The round-robin session: each partition's SERIAL read and a no-op transaction land
        # on each node in turn.
        for _ in range(NODES):
            for n in range(NODES):
                for pk in range(n * 100, n * 100 + LWT_PARTITIONS):
                    got = shed_tolerant(lambda: s.execute(serial, (pk,)).one().v)
                    assert got == 3, pk
                    got = shed_tolerant(lambda: s.execute(txn, (pk, pk)).one()[0])
                    assert got == 3, pk
    finally:
        cluster.shutdown()


class _Only(RoundRobinPolicy):
    """Every statement to one address."""

    def __init__(self, ip):
        super().__init__()
        self.ip = ip

    def make_query_plan(self, working_keyspace=None, query=None):
        return [h for h in super().make_query_plan(working_keyspace, query)
                if h.address == self.ip]
