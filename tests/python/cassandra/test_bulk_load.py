"""Bulk loads that Apache Cassandra absorbs: a client's window of requests in flight is a
bounded backlog, served (held back by backpressure), never answered `Overloaded`.

Both tests start their own 2-shard node with `--admission-pace-windows on` (off by default
until several open-loop connections that each grow slowly are seen pushing at once: see
docs/decisions/2026-11-27-read-ahead-shows-a-client-that-pushes.md), and with the newest
`sluice` binary built (release if it is newer than debug): a debug build runs a
200-row batch about ten times slower, and the point here is admission, not the build.
"""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT, Node

CQLSH = str(Path(sys.executable).parent / "cqlsh")
WRITE_DEADLINE_S = 2.0


def newest_binary():
    env = os.environ.get("SLUICE_BIN")
    if env:
        return env
    built = [ROOT / "target" / p / "sluice" for p in ("debug", "release")]
    built = [p for p in built if p.exists()]
    if not built:
        raise RuntimeError("build sluice first (cargo build -p sluice) or set SLUICE_BIN")
    return str(max(built, key=lambda p: p.stat().st_mtime))


@pytest.fixture(scope="module")
def bulk_node():
    before = os.environ.get("SLUICE_BIN")
    os.environ["SLUICE_BIN"] = newest_binary()
    try:
        n = Node(shards=2, extra=["--admission-pace-windows", "on"])
    finally:
        if before is None:
            del os.environ["SLUICE_BIN"]
        else:
            os.environ["SLUICE_BIN"] = before
    try:
        yield n
    finally:
        code = n.proc.poll()
        n.stop()
        assert code is None, f"sluice died during the bulk loads (exit {code})"


def test_256_unlogged_batches_in_flight_all_succeed(bulk_node):
    """The Python driver with its defaults (its retry policy turns `Overloaded` into a
    failure on a one-node cluster): 10,000 unlogged single-partition batches of 200 rows, 256
    in flight. Every batch succeeds, and every answer comes within the write deadline plus a
    margin, far from the driver's 10 s timeout."""
    from cassandra.cluster import Cluster
    from cassandra.query import BatchStatement, BatchType

    cluster = Cluster(["127.0.0.1"], port=bulk_node.port, protocol_version=4)
    try:
        s = cluster.connect()
        s.execute("CREATE KEYSPACE IF NOT EXISTS bulk WITH replication = "
                  "{'class': 'SimpleStrategy', 'replication_factor': 1}")
        s.execute("CREATE TABLE IF NOT EXISTS bulk.t (pk int, ck int, v text, PRIMARY KEY (pk, ck))")
        ins = s.prepare("INSERT INTO bulk.t (pk, ck, v) VALUES (?, ?, ?)")
        batches, rows, window = 10_000, 200, 256
        overloaded_before = bulk_node.metric_sum("sluice_errors_total", code="overloaded")

        slots = threading.Semaphore(window)
        lock = threading.Lock()
        done = threading.Event()
        failures, latencies = [], []
        left = [batches]

        def finish(started, error=None):
            with lock:
                latencies.append(time.monotonic() - started)
                if error is not None:
                    failures.append(repr(error)[:200])
                left[0] -= 1
                if left[0] == 0:
                    done.set()
            slots.release()

        t0 = time.monotonic()
        for b in range(batches):
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            for r in range(rows):
                batch.add(ins, (b, r, f"value-{r}"))
            slots.acquire()
            started = time.monotonic()
            future = s.execute_async(batch)
            future.add_callbacks(lambda _, t=started: finish(t), lambda e, t=started: finish(t, e))
        assert done.wait(600), "the load did not finish in 10 minutes"
        elapsed = time.monotonic() - t0

        overloaded = bulk_node.metric_sum("sluice_errors_total", code="overloaded") - overloaded_before
        assert not failures, f"{len(failures)} of {batches} failed, e.g. {failures[:3]}"
        assert overloaded == 0
        latencies.sort()
        worst = latencies[-1]
        print(f"{batches} batches in {elapsed:.1f} s; p50 {latencies[len(latencies) // 2] * 1e3:.0f} ms, "
              f"p99 {latencies[int(len(latencies) * 0.99)] * 1e3:.0f} ms, max {worst * 1e3:.0f} ms")
        # Measured at the client, so it includes the driver's own queueing in Python.
        assert worst < WRITE_DEADLINE_S + 2.0, f"an answer took {worst:.2f} s"
        stored = s.execute("SELECT count(*) FROM bulk.t WHERE pk = 9999").one()[0]
        assert stored == rows
    finally:
        cluster.shutdown()


def test_cqlsh_copy_from_imports_every_row(bulk_node, tmp_path):
    """cqlsh `COPY FROM` of a 200,000-row CSV with one worker and up to 512 batches of 20 rows
    in flight: every row imported, no failed-import line. (Its retry of an `Overloaded` batch
    sleeps in the driver's I/O thread while the window is full, so the client stops reading its
    answers and times them out: one `Overloaded` is enough to stall the import.)"""
    csv = tmp_path / "rows.csv"
    total = 200_000
    with open(csv, "w") as f:
        for i in range(total):
            f.write(f"{i},name-{i},{i * 7 % 1000}\n")
    env = {**os.environ, "CQLSH_NO_BUNDLED": "1"}
    ddl = ("CREATE KEYSPACE IF NOT EXISTS cp WITH replication = "
           "{'class': 'SimpleStrategy', 'replication_factor': 1}; "
           "CREATE TABLE IF NOT EXISTS cp.t (id int PRIMARY KEY, name text, n int);")
    r = subprocess.run([CQLSH, "127.0.0.1", str(bulk_node.port), "--request-timeout", "20", "-e", ddl],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    copy = (f"COPY cp.t (id, name, n) FROM '{csv}' WITH NUMPROCESSES=1 AND MAXBATCHSIZE=20 "
            "AND MAXINFLIGHTMESSAGES=512")
    t0 = time.monotonic()
    r = subprocess.run([CQLSH, "127.0.0.1", str(bulk_node.port), "-e", copy],
                       capture_output=True, text=True, timeout=240, env=env)
    elapsed = time.monotonic() - t0
    out = r.stdout + r.stderr
    failed = [line for line in out.splitlines() if "Failed to import" in line]
    print(f"COPY FROM took {elapsed:.1f} s")
    assert r.returncode == 0, out[-2000:]
    assert not failed, f"{len(failed)} failed-import lines, e.g. {failed[:3]}"
    assert f"{total} rows imported" in out, out[-2000:]

    from cassandra.cluster import Cluster
    from cassandra.query import SimpleStatement

    cluster = Cluster(["127.0.0.1"], port=bulk_node.port, protocol_version=4)
    try:
        s = cluster.connect()
        s.default_timeout = 60
        ids = {row.id for row in s.execute(SimpleStatement("SELECT id FROM cp.t", fetch_size=5000))}
        assert len(ids) == total and min(ids) == 0 and max(ids) == total - 1
    finally:
        cluster.shutdown()
