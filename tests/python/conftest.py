"""Starts the real `sluice` binary on free ports with a temporary data dir."""

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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    def __init__(self, shards=2):
        self.port = free_port()
        self.shard_aware_port = free_port()
        self.metrics_port = free_port()
        self.shards = shards
        self.data_dir = tempfile.mkdtemp(prefix="sluice-pytest-")
        self.log = open(os.path.join(self.data_dir, "server.log"), "wb")
        self.proc = subprocess.Popen(
            [
                sluice_bin(), "serve",
                "--listen", f"127.0.0.1:{self.port}",
                "--data-dir", os.path.join(self.data_dir, "data"),
                "--shards", str(shards),
                "--shard-aware-port", str(self.shard_aware_port),
                "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
                "--durability", "periodic",
                "--log", "warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sluice exited early:\n{self.server_log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
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
