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


def port_free_on_every_ip(nodes):
    """A port free on 127.0.0.1 up to 127.0.0.`nodes` (each node binds it on its own IP)."""
    for _ in range(100):
        port = free_port()
        ok = True
        for i in range(1, nodes + 1):
            with socket.socket() as s:
                try:
                    s.bind((f"127.0.0.{i}", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return port
    raise RuntimeError("no port free on every node's address")


LOCAL_CLUSTER_NODES = 3


@pytest.fixture(scope="module")
def local_cluster():
    """`sluice cluster --nodes 3` on 127.0.0.1-3 (eight tokens each, periodic durability), in a
    temporary directory removed afterwards; yields the CQL port every node listens on."""
    nodes = LOCAL_CLUSTER_NODES
    directory = tempfile.mkdtemp(prefix="sluice-pytest-cluster-")
    cql = port_free_on_every_ip(nodes)
    out_path = os.path.join(directory, "cluster.out")
    out = open(out_path, "wb")
    proc = subprocess.Popen(
        [sluice_bin(), "cluster", "--nodes", str(nodes), "--dir", directory,
         "--cql-port", str(cql),
         "--shard-aware-port", str(port_free_on_every_ip(nodes)),
         "--internode-port", str(port_free_on_every_ip(nodes)),
         "--metrics-port", "off", "--num-tokens", "8",
         "--serve-arg=--durability=periodic"],
        stdout=out, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while b"connect with" not in open(out_path, "rb").read():
            output = open(out_path, "rb").read().decode(errors="replace")
            if proc.poll() is not None:
                raise RuntimeError(f"sluice cluster exited ({proc.returncode}):\n{output}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not start within 120 s:\n{output}")
            time.sleep(0.1)
        yield cql
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.close()
        shutil.rmtree(directory, ignore_errors=True)


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
