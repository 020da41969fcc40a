"""Starts the real `sluice` binary on free ports with a temporary data dir, and opens driver
sessions to it (the cassandra-driver and the scylla-driver both ship the `cassandra` package)."""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port():
    """A free port below Linux's ephemeral range (32768..), so that client sockets opened
    meanwhile cannot take it before the server binds it."""
    import random

    for _ in range(1000):
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000..32000")


def sluice_bin():
    env = os.environ.get("SLUICE_BIN")
    if env:
        return env
    for profile in ("debug", "release"):
        p = ROOT / "target" / profile / "sluice"
        if p.exists():
            return str(p)
    raise RuntimeError("build sluice first (cargo build -p sluice) or set SLUICE_BIN")


class Node:
    def __init__(self, shards=2, extra=()):
        self.shards = shards
        self.extra = list(extra)
        self.data_dir = tempfile.mkdtemp(prefix="sluice-pytest-")
        self.log = open(os.path.join(self.data_dir, "server.log"), "wb")
        # Kept across restarts: the cluster knows the node at this internode address.
        self.internode_port = free_port()
        # A port taken between the check and the bind makes the server exit: try new ones.
        for _ in range(5):
            if self._start():
                return
        self.stop()
        raise RuntimeError("sluice could not bind free ports in 5 tries")

    def _start(self):
        self.log.seek(0)
        self.log.truncate()
        self.port = free_port()
        self.shard_aware_port = free_port()
        self.metrics_port = free_port()
        self.proc = subprocess.Popen(
            [
                sluice_bin(), "serve",
                "--listen", f"127.0.0.1:{self.port}",
                "--data-dir", os.path.join(self.data_dir, "data"),
                "--shards", str(self.shards),
                "--shard-aware-port", str(self.shard_aware_port),
                "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
                "--internode-listen", f"127.0.0.1:{self.internode_port}",
                "--durability", "periodic",
                "--log", "warn",
                *self.extra,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        ports = (self.port, self.shard_aware_port, self.metrics_port)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                if "in use" in self.server_log():
                    if "internode listener" in self.server_log():
                        self.internode_port = free_port()
                    return False
                raise RuntimeError(f"sluice exited early:\n{self.server_log()}")
            try:
                for port in ports:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                        pass
                return True
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("sluice did not start listening within 30 s")

    def server_log(self):
        try:
            return Path(self.log.name).read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def metrics(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def metric_sum(self, name, **labels):
        total = 0.0
        for line in self.metrics().splitlines():
            if not line.startswith(name + "{"):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def node():
    n = Node()
    try:
        yield n
    finally:
        code = n.proc.poll()
        n.stop()
        assert code is None, f"sluice died during the tests (exit {code})"


@pytest.fixture(scope="session")
def cql_session(node):
    """A context manager opening a v4 session to the node that creates `keyspace` (one replica),
    runs `ddl`, optionally makes the keyspace current, and shuts the cluster down on exit."""
    from cassandra.cluster import Cluster

    @contextlib.contextmanager
    def open_session(keyspace, *ddl, use_keyspace=False):
        cluster = Cluster(["127.0.0.1"], port=node.port, protocol_version=4, connect_timeout=20)
        try:
            s = cluster.connect()
            s.default_timeout = 30
            s.execute(f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = "
                      "{'class': 'SimpleStrategy', 'replication_factor': 1}")
            for statement in ddl:
                s.execute(statement)
            if use_keyspace:
                s.set_keyspace(keyspace)
            yield s
        finally:
            cluster.shutdown()

    return open_session


@pytest.fixture(scope="session")
def rate_limited_session(cql_session):
    """Like `cql_session`, also creating `keyspace.t` (pk, ck, v) limited to `limit` writes per
    second and partition."""

    def open_session(keyspace, limit):
        return cql_session(
            keyspace,
            f"CREATE TABLE IF NOT EXISTS {keyspace}.t (pk int, ck int, v int, PRIMARY KEY (pk, ck)) "
            f"WITH per_partition_rate_limit = {{'max_writes_per_second': {limit}}}")

    return open_session


@pytest.fixture(scope="session")
def hammer_hot_partition(node):
    """Writes 300 rows to partition 1 of `keyspace.t` (pk, ck, v) as fast as possible, where the
    table limits writes to `limit` per second; each rejection must raise `rejection`, which
    `check` inspects. Asserts that no rejected write was retried or left data behind and that
    other partitions are unaffected; returns the rejected clustering keys."""

    def hammer(session, keyspace, limit, rejection, check):
        ins = session.prepare(f"INSERT INTO {keyspace}.t (pk, ck, v) VALUES (?, ?, ?)")
        executes_before = node.metric_sum("sluice_requests_total", opcode="execute")
        accepted, rejected = set(), set()
        for ck in range(300):
            try:
                session.execute(ins, (1, ck, ck))
                accepted.add(ck)
            except rejection as e:
                check(e)
                rejected.add(ck)
        executes = node.metric_sum("sluice_requests_total", opcode="execute") - executes_before
        assert executes == 300, "a rate-limited write must not be retried"
        assert rejected, "300 writes to one partition: none rejected"
        assert len(accepted) >= limit
        stored = {r.ck for r in session.execute(f"SELECT ck FROM {keyspace}.t WHERE pk = 1")}
        assert stored == accepted, "a rejected write left data behind"
        # Other partitions are unaffected.
        for pk in range(2, 40):
            session.execute(ins, (pk, 0, 0))
        return rejected

    return hammer
