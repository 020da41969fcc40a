"""Transactions and LWT across replicas, through the cluster's transaction log: three
`sluice serve` processes on 127.0.0.1-3 (RF 3), the Python cassandra-driver with one session
pinned to each node.

- The bank transfer of test_transactions.py with clients on all three coordinators, the total
  read by a read-only transaction after every transfer, kill -9 of one node in the middle (a
  follower of the Raft group, then the node that usually leads it), its restart, and then: the total is exact on every node, every acknowledged transfer is logged,
  and the balances are exactly what the logged transfers make of the start.
- Concurrent `UPDATE ... IF v = ?` increments through the three coordinators: the counter ends
  at the number of acknowledged increments (none lost, none applied twice)."""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import pytest

from bank import (ACCOUNTS, START_BALANCE, TOTAL, TRANSFER, Ledger, balances,
                  create_bank_tables, expected_balances_after_restart)
from conftest import port_free_on_every_ip, sluice_bin

NODES = 3


class ClusterNodes:
    """Three `sluice serve` processes (what `sluice cluster` starts), each killable alone."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="sluice-pytest-txncluster-")
        self.cql = port_free_on_every_ip(NODES)
        self.shard_aware = port_free_on_every_ip(NODES)
        self.internode = port_free_on_every_ip(NODES)
        self.metrics_port = port_free_on_every_ip(NODES)
        self.procs = {}
        for index in range(1, NODES + 1):
            self.start(index)

    def ip(self, index):
        return f"127.0.0.{index}"

    def start(self, index):
        ip = self.ip(index)
        args = [sluice_bin(), "serve", "--listen", f"{ip}:{self.cql}",
                "--shard-aware-port", str(self.shard_aware),
                "--internode-listen", f"{ip}:{self.internode}",
                "--metrics-listen", f"{ip}:{self.metrics_port}",
                "--data-dir", os.path.join(self.dir, f"node{index}"),
                "--shards", "2", "--num-tokens", "8", "--durability", "periodic"]
        if index > 1:
            args += ["--seeds", f"127.0.0.1:{self.internode}"]
        log = open(os.path.join(self.dir, f"node{index}.log"), "ab")
        self.procs[index] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while True:
            if self.procs[index].poll() is not None:
                raise RuntimeError(f"node {index} exited: {self.log(index)}")
            with socket.socket() as s:
                if s.connect_ex((ip, self.cql)) == 0:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {index} did not serve within 120 s: {self.log(index)}")
            time.sleep(0.1)

    def metric(self, index, name):
        import urllib.request

        url = f"http://{self.ip(index)}:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        raise KeyError(name)

    def log(self, index):
        with open(os.path.join(self.dir, f"node{index}.log"), "rb") as f:
            return f.read().decode(errors="replace")[-3000:]

    def kill(self, index):
        self.procs[index].kill()  # SIGKILL
        self.procs[index].wait()

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def nodes():
    c = ClusterNodes()
    try:
        yield c
    finally:
        c.stop()


def pinned(nodes, index, timeout=10):
    """A session whose every request goes to node `index` and is never retried elsewhere."""
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import FallthroughRetryPolicy, WhiteListRoundRobinPolicy

    profile = ExecutionProfile(
        load_balancing_policy=WhiteListRoundRobinPolicy([nodes.ip(index)]),
        retry_policy=FallthroughRetryPolicy(),
        request_timeout=timeout,
    )
    cluster = Cluster([nodes.ip(index)], port=nodes.cql, protocol_version=4,
                      execution_profiles={EXEC_PROFILE_DEFAULT: profile}, connect_timeout=20)
    return cluster, cluster.connect()


@pytest.mark.parametrize("victim", [3, 1])
def test_bank_transfers_on_three_nodes_survive_kill_9_of_one(nodes, victim):
    """`victim` 3 is a follower of the group; node 1 started it and usually leads it."""
    for index in range(1, NODES + 1):
        if nodes.procs[index].poll() is not None:
            nodes.start(index)
    ks = f"bank{victim}"
    transfer_text = TRANSFER.replace("bank.", ks + ".")
    total_text = TOTAL.replace("bank.", ks + ".")
    setup = 2 if victim == 1 else 1
    cluster, s = pinned(nodes, setup)
    create_bank_tables(s, ks, 3)
    # The opening balances go through the log too (one write-only transaction).
    s.execute("BEGIN TRANSACTION\n" + "\n".join(
        f"  INSERT INTO {ks}.acct (id, balance) VALUES ({i}, {START_BALANCE});"
        for i in range(ACCOUNTS)) + "\nCOMMIT TRANSACTION")
    cluster.shutdown()
    expected_total = ACCOUNTS * START_BALANCE

    ledger = Ledger()
    stop = threading.Event()
    victim_dead = threading.Event()
    sessions = {i: pinned(nodes, i) for i in range(1, NODES + 1)}

    def client(n, index):
        s = sessions[index][1]
        for attempt in range(50):
            # A loaded machine can answer Overloaded from admission control: try again.
            try:
                prepared_transfer = s.prepare(transfer_text)
                prepared_total = s.prepare(total_text)
                break
            except Exception:
                if attempt == 49:
                    raise
                time.sleep(0.1)
        i = 0
        while not stop.is_set():
            if index == victim and victim_dead.is_set():
                return
            i += 1
            tid = ledger.transfer(s, prepared_transfer, n, i)
            if tid is None:
                # No answer (a timeout around the kill, or the node is gone): unknown.
                time.sleep(0.05)
                continue
            try:
                total = sum(balances(s, prepared_total))
            except Exception:
                time.sleep(0.05)
                continue
            if not ledger.check_total(total, f"{tid} through node {index}"):
                return

    def log_counts():
        return [sum(nodes.metric(i, f"sluice_txn_log_{what}_total") for i in range(1, NODES + 1))
                for what in ("commits", "conflicts")]

    commits_at_start, conflicts_at_start = log_counts()
    workers = [threading.Thread(target=client, args=(n, 1 + n % NODES)) for n in range(6)]
    started = time.monotonic()
    for w in workers:
        w.start()
    time.sleep(4)
    acked_before_kill = len(ledger.acked)
    commits, conflicts = log_counts()
    commits -= commits_at_start
    conflicts -= conflicts_at_start
    print(f"\nbefore the kill: {commits:.0f} commits through the log, {conflicts:.0f} conflicts "
          f"({conflicts / max(commits, 1):.2f} per commit)")
    assert commits >= acked_before_kill
    victim_dead.set()
    nodes.kill(victim)
    killed_at = time.monotonic()
    # The time of the first transfer acknowledged after the kill, for the report.
    while len(ledger.acked) == acked_before_kill and time.monotonic() - killed_at < 15:
        time.sleep(0.01)
    resumed = time.monotonic() - killed_at
    time.sleep(4)
    stop.set()
    for w in workers:
        w.join(timeout=60)
    elapsed = time.monotonic() - started
    assert not any(w.is_alive() for w in workers)
    for c, _ in sessions.values():
        c.shutdown()
    assert not ledger.errors, ledger.errors
    print(f"\nnode {victim} killed: {len(ledger.acked)} transfers applied "
          f"({acked_before_kill} before the kill), {len(ledger.refused)} refused by the IF, "
          f"{len(ledger.unknown)} without an answer, "
          f"total checked {ledger.totals_checked} times in {elapsed:.1f} s; the first transfer "
          f"after the kill was acknowledged {resumed:.2f} s after it")
    assert acked_before_kill > 10, f"too few transfers before the kill: {acked_before_kill}"
    assert len(ledger.acked) > acked_before_kill, "transfers went on with two nodes of three"
    assert ledger.totals_checked > 10

    nodes.start(victim)
    sessions = {i: pinned(nodes, i) for i in range(1, NODES + 1)}
    try:
        s1 = sessions[setup][1]
        expect = expected_balances_after_restart(s1, ks, transfer_text, ledger)
        # Every node, the restarted one included, answers the same exact balances.
        for index in range(1, NODES + 1):
            final = balances(sessions[index][1], sessions[index][1].prepare(total_text))
            assert final == expect, (index, final, expect)
            assert sum(final) == expected_total
    finally:
        for c, _ in sessions.values():
            c.shutdown()


def test_lwt_increments_through_three_coordinators_lose_nothing(nodes):
    for index in range(1, NODES + 1):
        if nodes.procs[index].poll() is not None:
            nodes.start(index)
    cluster, s = pinned(nodes, 1)
    s.execute("CREATE KEYSPACE IF NOT EXISTS lwt WITH replication = "
              "{'class': 'SimpleStrategy', 'replication_factor': 3}")
    s.execute("CREATE TABLE IF NOT EXISTS lwt.counter (k int PRIMARY KEY, v int)")
    rows = s.execute("INSERT INTO lwt.counter (k, v) VALUES (1, 0) IF NOT EXISTS")
    assert rows.one()[0] is True
    cluster.shutdown()

    from cassandra import ConsistencyLevel
    from cassandra.query import SimpleStatement

    sessions = {i: pinned(nodes, i) for i in range(1, NODES + 1)}
    increments = [0]
    unknown = [0]
    not_applied = [0]
    lock = threading.Lock()
    stop = threading.Event()

    def client(index):
        s = sessions[index][1]
        read = SimpleStatement("SELECT v FROM lwt.counter WHERE k = 1",
                               consistency_level=ConsistencyLevel.SERIAL)
        cas = s.prepare("UPDATE lwt.counter SET v = ? WHERE k = 1 IF v = ?")
        current = s.execute(read).one().v
        while not stop.is_set():
            try:
                row = s.execute(cas, (current + 1, current)).one()
            except Exception:
                with lock:
                    unknown[0] += 1
                current = s.execute(read).one().v
                continue
            if row[0]:
                with lock:
                    increments[0] += 1
                current += 1
            else:
                with lock:
                    not_applied[0] += 1
                current = row.v

    workers = [threading.Thread(target=client, args=(1 + n % NODES,)) for n in range(6)]
    for w in workers:
        w.start()
    time.sleep(5)
    stop.set()
    for w in workers:
        w.join(timeout=60)
    assert not any(w.is_alive() for w in workers)
    try:
        finals = []
        for index in range(1, NODES + 1):
            read = SimpleStatement("SELECT v FROM lwt.counter WHERE k = 1",
                                   consistency_level=ConsistencyLevel.SERIAL)
            finals.append(sessions[index][1].execute(read).one().v)
    finally:
        for c, _ in sessions.values():
            c.shutdown()
    print(f"\n{increments[0]} increments applied, {not_applied[0]} not applied (contention), "
          f"{unknown[0]} without an answer; final values {finals}")
    assert increments[0] > 20
    assert len(set(finals)) == 1, finals
    # Every acknowledged increment is there, and only an unanswered one can add to them.
    assert increments[0] <= finals[0] <= increments[0] + unknown[0], (finals, increments, unknown)


def test_full_transactional_mode_sends_plain_writes_through_the_log(nodes):
    for index in range(1, NODES + 1):
        if nodes.procs[index].poll() is not None:
            nodes.start(index)
    cluster, s = pinned(nodes, 1)
    s.execute("CREATE KEYSPACE IF NOT EXISTS fullmode WITH replication = "
              "{'class': 'SimpleStrategy', 'replication_factor': 3}")
    s.execute("CREATE TABLE IF NOT EXISTS fullmode.kv (k int PRIMARY KEY, v int) "
              "WITH transactional_mode = 'full'")
    s.execute("CREATE TABLE IF NOT EXISTS fullmode.off (k int PRIMARY KEY, v int)")
    cluster.shutdown()
    from cassandra import ConsistencyLevel
    from cassandra.query import SimpleStatement

    sessions = {i: pinned(nodes, i) for i in range(1, NODES + 1)}
    try:
        before = nodes.metric(2, "sluice_txn_log_commits_total")
        s2 = sessions[2][1]
        for v in range(20):
            s2.execute("UPDATE fullmode.kv SET v = %s WHERE k = 1", (v,))
            s2.execute("UPDATE fullmode.off SET v = %s WHERE k = 1", (v,))
        # The 20 plain writes of the 'full' table went through the log; the 'off' ones did not.
        assert nodes.metric(2, "sluice_txn_log_commits_total") - before == 20
        # A plain write is ordered with LWT: a conditional write through another coordinator
        # right after it sees it.
        s2.execute("UPDATE fullmode.kv SET v = 100 WHERE k = 1")
        row = sessions[3][1].execute("UPDATE fullmode.kv SET v = 101 WHERE k = 1 IF v = 100").one()
        assert row[0] is True, row
        for index in range(1, NODES + 1):
            read = SimpleStatement("SELECT v FROM fullmode.kv WHERE k = 1",
                                   consistency_level=ConsistencyLevel.SERIAL)
            assert sessions[index][1].execute(read).one().v == 101
    finally:
        for c, _ in sessions.values():
            c.shutdown()
