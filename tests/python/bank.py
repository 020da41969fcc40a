"""The bank-transfer workload of test_transactions.py (one node) and
test_transactions_cluster.py (three nodes): the statements, the choice of each transfer, and
the check after a kill -9 and restart that nothing was lost, applied twice or applied in part."""

import threading
import uuid

ACCOUNTS = 8
START_BALANCE = 1000

TRANSFER = """BEGIN TRANSACTION
  LET src = (SELECT balance FROM bank.acct WHERE id = ?);
  LET dst = (SELECT balance FROM bank.acct WHERE id = ?);
  LET done = (SELECT id FROM bank.transfers WHERE id = ?);
  SELECT src.balance, dst.balance, done.id;
  IF done IS NULL AND src.balance >= ? THEN
    UPDATE bank.acct SET balance = balance - ? WHERE id = ?;
    UPDATE bank.acct SET balance = balance + ? WHERE id = ?;
    INSERT INTO bank.transfers (id, src, dst, amount) VALUES (?, ?, ?, ?);
  END IF
COMMIT TRANSACTION"""

TOTAL = "BEGIN TRANSACTION\n{lets}\n  SELECT {refs};\nCOMMIT TRANSACTION".format(
    lets="\n".join(f"  LET a{i} = (SELECT balance FROM bank.acct WHERE id = {i});"
                   for i in range(ACCOUNTS)),
    refs=", ".join(f"a{i}.balance" for i in range(ACCOUNTS)),
)


def create_bank_tables(session, ks, replication_factor):
    """Creates keyspace `ks` with its `acct` and `transfers` tables (no rows)."""
    session.execute(f"CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = "
                    f"{{'class': 'SimpleStrategy', 'replication_factor': {replication_factor}}}")
    session.execute(f"CREATE TABLE IF NOT EXISTS {ks}.acct (id int PRIMARY KEY, balance bigint)")
    session.execute(f"CREATE TABLE IF NOT EXISTS {ks}.transfers "
                    "(id text PRIMARY KEY, src int, dst int, amount bigint)")


def next_transfer(client, step):
    """The transfer that `client` makes at `step`: (id, source, destination, amount), the two
    accounts always different and the id unique across runs."""
    src, dst = (client + step) % ACCOUNTS, (client + 3 * step + 1) % ACCOUNTS
    if src == dst:
        dst = (dst + 1) % ACCOUNTS
    amount = 1 + (step * 7 + client) % 50
    return f"{client}-{step}-{uuid.uuid4().hex[:8]}", src, dst, amount


def transfer_args(tid, src, dst, amount):
    return (src, dst, tid, amount, amount, src, amount, dst, tid, src, dst, amount)


def applied(row, amount):
    """Accord answers no [applied]: the client re-evaluates the IF on the returned values."""
    return row.done_id is None and row.src_balance is not None and row.src_balance >= amount


def balances(session, total_stmt):
    row = session.execute(total_stmt).one()
    return [row[i] for i in range(ACCOUNTS)]


class Ledger:
    """What the clients of a bank run were told, shared by their threads."""

    def __init__(self):
        self.acked = {}       # transfer id -> (src, dst, amount), acknowledged as applied
        self.refused = set()  # acknowledged, IF false (not enough money)
        self.unknown = {}     # transfer id -> (src, dst, amount): no answer
        self.errors = []
        self.totals_checked = 0
        self._lock = threading.Lock()

    def transfer(self, session, prepared_transfer, client, step):
        """Makes transfer `step` of `client` and records its answer; returns the transfer's
        id, or None when it had no answer."""
        tid, src, dst, amount = next_transfer(client, step)
        try:
            row = session.execute(prepared_transfer, transfer_args(tid, src, dst, amount)).one()
        except Exception:
            self.unanswered(tid, src, dst, amount)
            return None
        self.answered(row, tid, src, dst, amount)
        return tid

    def answered(self, row, tid, src, dst, amount):
        """Records the answer `row` to transfer `tid`: applied or refused by its IF."""
        with self._lock:
            if applied(row, amount):
                self.acked[tid] = (src, dst, amount)
            else:
                self.refused.add(tid)

    def unanswered(self, tid, src, dst, amount):
        """Records a transfer that had no answer: it may or may not have applied."""
        with self._lock:
            self.unknown[tid] = (src, dst, amount)

    def check_total(self, total, after):
        """Counts a total read after transfer `after`; one that is not the opening total is an
        error, and then the answer is False."""
        with self._lock:
            if total != ACCOUNTS * START_BALANCE:
                self.errors.append(f"total {total} after transfer {after}")
                return False
            self.totals_checked += 1
            return True


def logged_transfers(session, ks):
    """Transfer id -> (source, destination, amount) of every transfer in `ks`.transfers."""
    return {r.id: (r.src, r.dst, r.amount)
            for r in session.execute(f"SELECT id, src, dst, amount FROM {ks}.transfers")}


def expected_balances_after_restart(session, ks, transfer_text, ledger):
    """Checks that every acknowledged transfer is logged and no refused one is, retries the
    transfers that had no answer with the same id (so each applies at most once in all), and
    returns the balances that the logged transfers make of the start."""
    logged = logged_transfers(session, ks)
    missing = [t for t in ledger.acked if t not in logged]
    assert not missing, missing
    assert not (ledger.refused & logged.keys())
    prepared_transfer = session.prepare(transfer_text)
    for tid, (src, dst, amount) in ledger.unknown.items():
        row = session.execute(prepared_transfer, transfer_args(tid, src, dst, amount)).one()
        if tid in logged:
            assert row.done_id == tid, "an applied transfer is recognised on retry"
    # Nothing applied twice, nothing applied in part, nothing applied without its log entry.
    expect = [START_BALANCE] * ACCOUNTS
    for src, dst, amount in logged_transfers(session, ks).values():
        expect[src] -= amount
        expect[dst] += amount
    return expect
