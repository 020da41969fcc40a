"""Multi-partition transactions (BEGIN TRANSACTION ... COMMIT TRANSACTION, Accord's CQL)
through the Python cassandra-driver against the real binary: a bank-transfer workload from
several clients with the total checked after every step, then kill -9 of the server in the
middle, a restart, and the check that nothing was lost, applied twice or applied in part."""

import threading
import time

import pytest

from bank import (ACCOUNTS, START_BALANCE, TOTAL, TRANSFER, Ledger, balances,
                  create_bank_tables, expected_balances_after_restart)
from conftest import Node

CLIENTS = 4


def connect(node):
    from cassandra.cluster import Cluster

    cluster = Cluster(["127.0.0.1"], port=node.port, protocol_version=4, connect_timeout=20)
    session = cluster.connect()
    session.default_timeout = 10
    return cluster, session


@pytest.fixture(scope="module")
def bank_node():
    n = Node(shards=2)
    try:
        yield n
    finally:
        n.stop()


def test_transactions_return_rows_named_after_let_columns(bank_node):
    cluster, s = connect(bank_node)
    try:
        s.execute("CREATE KEYSPACE IF NOT EXISTS shapes WITH replication = "
                  "{'class': 'SimpleStrategy', 'replication_factor': 1}")
        s.execute("CREATE TABLE IF NOT EXISTS shapes.kv (k int PRIMARY KEY, v int)")
        s.execute("INSERT INTO shapes.kv (k, v) VALUES (1, 10)")
        rows = s.execute("""BEGIN TRANSACTION
              LET a = (SELECT v FROM shapes.kv WHERE k = 1);
              LET b = (SELECT v FROM shapes.kv WHERE k = 2);
              SELECT a.v, b.v;
              IF a.v = 10 AND b IS NULL THEN
                INSERT INTO shapes.kv (k, v) VALUES (2, 20);
              END IF
            COMMIT TRANSACTION""")
        assert rows.column_names == ["a.v", "b.v"]
        assert list(rows.one()) == [10, None]
        # Write-only: Void, as Accord answers.
        result = s.execute("""BEGIN TRANSACTION
              UPDATE shapes.kv SET v = 11 WHERE k = 1;
              UPDATE shapes.kv SET v = 21 WHERE k = 2;
            COMMIT TRANSACTION""")
        assert result.one() is None
        assert sorted(tuple(r) for r in s.execute("SELECT k, v FROM shapes.kv")) == [(1, 11), (2, 21)]
        from cassandra import InvalidRequest
        with pytest.raises(InvalidRequest, match="Counter tables|no reads or writes"):
            s.execute("BEGIN TRANSACTION COMMIT TRANSACTION")
    finally:
        cluster.shutdown()


def test_bank_transfers_survive_kill_9_exactly_once(bank_node):
    cluster, s = connect(bank_node)
    create_bank_tables(s, "bank", 1)
    for i in range(ACCOUNTS):
        s.execute("INSERT INTO bank.acct (id, balance) VALUES (%s, %s)", (i, START_BALANCE))
    expected_total = ACCOUNTS * START_BALANCE

    ledger = Ledger()  # its unanswered transfers are those the kill cut off
    stop = threading.Event()

    def client(n):
        prepared_transfer = s.prepare(TRANSFER)
        prepared_total = s.prepare(TOTAL)
        i = 0
        while not stop.is_set():
            i += 1
            tid = ledger.transfer(s, prepared_transfer, n, i)
            if tid is None:
                return
            try:
                total = sum(balances(s, prepared_total))
            except Exception:
                return
            if not ledger.check_total(total, tid):
                return

    workers = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for w in workers:
        w.start()
    time.sleep(3)
    committed_before_kill = bank_node.metric_sum("sluice_txn_commits_total", wrote="true")
    bank_node.proc.kill()  # SIGKILL, mid-run
    bank_node.proc.wait()
    stop.set()
    for w in workers:
        w.join(timeout=60)
    assert not any(w.is_alive() for w in workers)
    cluster.shutdown()
    assert not ledger.errors, ledger.errors
    print(f"before the kill: {len(ledger.acked)} transfers applied, "
          f"{len(ledger.refused)} refused by the IF, {len(ledger.unknown)} without an answer, "
          f"total checked {ledger.totals_checked} times")
    assert len(ledger.acked) > 10, f"too few transfers before the kill: {len(ledger.acked)}"
    assert ledger.totals_checked > 10
    assert committed_before_kill >= 10

    assert bank_node._start(), "sluice restarts on its data directory"
    cluster, s = connect(bank_node)
    try:
        total_stmt = s.prepare(TOTAL)
        after = balances(s, total_stmt)
        assert sum(after) == expected_total, after
        # Every acknowledged transfer survived, and the retried ones applied at most once.
        expect = expected_balances_after_restart(s, "bank", TRANSFER, ledger)
        final = balances(s, total_stmt)
        assert final == expect, (final, expect)
        assert sum(final) == expected_total
    finally:
        cluster.shutdown()
