#!/usr/bin/env python3
"""A TTL workload against a running node: every write `USING TTL <ttl>` at a steady rate
(open loop), reads of recent keys beside them, and every `--sample` seconds one line with
the data directory's disk use and the window's read p50/p99.

    .venv/cassandra/bin/python scripts/ttl_workload.py --port 9042 --data-dir /tmp/x/data \
        --minutes 10 --write-rate 1000 --read-rate 200

Requests are sent on schedule whether or not earlier ones have answered (at most
`--max-inflight` outstanding; a send skipped for that cap is counted), and a latency is
measured from the request's scheduled time, so that a stalled server shows in it.
"""

import argparse
import os
import subprocess
import threading
import time

from cassandra.cluster import Cluster


def disk_bytes(path):
    out = subprocess.run(["du", "-sb", path], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def percentile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9042)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--write-rate", type=int, default=1000)
    ap.add_argument("--read-rate", type=int, default=200)
    ap.add_argument("--ttl", type=int, default=60)
    ap.add_argument("--gc-grace", type=int, default=30)
    ap.add_argument("--value-bytes", type=int, default=1000)
    ap.add_argument("--sample", type=float, default=30)
    ap.add_argument("--max-inflight", type=int, default=2000)
    a = ap.parse_args()

    cluster = Cluster([a.host], port=a.port, protocol_version=4, connect_timeout=20)
    s = cluster.connect()
    s.execute("CREATE KEYSPACE IF NOT EXISTS ttlw WITH replication = "
              "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    s.execute(f"CREATE TABLE IF NOT EXISTS ttlw.kv (k bigint PRIMARY KEY, v blob) "
              f"WITH gc_grace_seconds = {a.gc_grace}")
    ins = s.prepare(f"INSERT INTO ttlw.kv (k, v) VALUES (?, ?) USING TTL {a.ttl}")
    sel = s.prepare("SELECT v FROM ttlw.kv WHERE k = ?")
    value = os.urandom(a.value_bytes)

    lock = threading.Lock()
    state = {"inflight": 0, "read_lat": [], "errors": 0, "skipped": 0, "writes": 0,
             "reads": 0, "misses": 0}

    def done(kind, scheduled):
        def ok(rows):
            with lock:
                state["inflight"] -= 1
                if kind == "read":
                    state["read_lat"].append(time.monotonic() - scheduled)
                    state["reads"] += 1
                    if not rows:
                        state["misses"] += 1
                else:
                    state["writes"] += 1

        def err(e):
            with lock:
                state["inflight"] -= 1
                state["errors"] += 1
                state.setdefault("first_error", f"{kind}: {e!r}")
        return ok, err

    def send(stmt, params, kind, scheduled):
        with lock:
            if state["inflight"] >= a.max_inflight:
                state["skipped"] += 1
                return
            state["inflight"] += 1
        f = s.execute_async(stmt, params)
        ok, err = done(kind, scheduled)
        f.add_callbacks(ok, err)

    start = time.monotonic()
    end = start + a.minutes * 60
    next_sample = start + a.sample
    writes_sent = reads_sent = 0
    print("elapsed_s,disk_mb,writes_done,reads_done,read_p50_ms,read_p99_ms,errors,skipped,"
          "read_misses", flush=True)
    while True:
        now = time.monotonic()
        if now >= end:
            break
        elapsed = now - start
        while writes_sent < elapsed * a.write_rate:
            scheduled = start + writes_sent / a.write_rate
            send(ins, (writes_sent, value), "write", scheduled)
            writes_sent += 1
        while reads_sent < elapsed * a.read_rate:
            scheduled = start + reads_sent / a.read_rate
            # A key written about ttl/2 seconds ago: alive.
            k = max(0, writes_sent - int(a.write_rate * a.ttl / 2))
            send(sel, (k,), "read", scheduled)
            reads_sent += 1
        if now >= next_sample:
            with lock:
                lat = sorted(state["read_lat"])
                state["read_lat"] = []
                snap = dict(state)
            print(f"{round(now - start)},{disk_bytes(a.data_dir) / 1e6:.1f},{snap['writes']},"
                  f"{snap['reads']},{percentile(lat, 0.5) * 1e3:.2f},"
                  f"{percentile(lat, 0.99) * 1e3:.2f},{snap['errors']},{snap['skipped']},"
                  f"{snap['misses']}", flush=True)
            next_sample += a.sample
        time.sleep(0.002)
    time.sleep(2)
    if "first_error" in state:
        print(f"first error: {state['first_error']}", flush=True)
    cluster.shutdown()


if __name__ == "__main__":
    main()
