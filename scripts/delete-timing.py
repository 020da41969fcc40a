"""Time a partition DELETE of ROWS x ROW_BYTES rows through CQL on a one-shard node, and a
read of another partition sent right behind it (both on the one shard).

Usage: .venv/cassandra/bin/python scripts/delete-timing.py target/debug/sluice
(env: ROWS, default 2000; ROW_BYTES, default 102400; DATA_DIR, removed at the end)."""
import os, subprocess, sys, time, shutil
from cassandra.cluster import Cluster
from cassandra.query import SimpleStatement

BIN = sys.argv[1]
ROWS = int(os.environ.get("ROWS", 2000))
ROW_BYTES = int(os.environ.get("ROW_BYTES", 100 * 1024))
DATA = os.environ.get("DATA_DIR", "/tmp/sluice-delete-timing")
shutil.rmtree(DATA, ignore_errors=True)
port = 19642
proc = subprocess.Popen([BIN, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", DATA,
                         "--shards", "1", "--shard-aware-port", str(port + 1),
                         "--metrics-listen", f"127.0.0.1:{port + 2}",
                         "--durability", "periodic", "--log", "warn"])
try:
    for _ in range(100):
        try:
            cluster = Cluster(["127.0.0.1"], port=port, connect_timeout=2)
            s = cluster.connect()
            break
        except Exception:
            time.sleep(0.2)
    s.default_timeout = 60
    s.execute("CREATE KEYSPACE k WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}")
    s.execute("CREATE TABLE k.t (pk int, ck int, v blob, PRIMARY KEY (pk, ck))")
    ins = s.prepare("INSERT INTO k.t (pk, ck, v) VALUES (?, ?, ?)")
    blob = b"x" * ROW_BYTES
    for c in range(0, ROWS, 50):
        futs = [s.execute_async(ins, (0, i, blob)) for i in range(c, min(ROWS, c + 50))]
        for f in futs:
            f.result()
    s.execute("INSERT INTO k.t (pk, ck, v) VALUES (1, 0, 0x00)")
    sel = s.prepare("SELECT ck FROM k.t WHERE pk = 1")
    for _ in range(20):
        s.execute(sel)
    dele = s.prepare("DELETE FROM k.t WHERE pk = ?")
    t0 = time.perf_counter()
    fd = s.execute_async(dele, (0,))
    fr = s.execute_async(sel)
    fr.result()
    t_read = time.perf_counter() - t0
    fd.result()
    t_del = time.perf_counter() - t0
    n = len(list(s.execute(SimpleStatement("SELECT ck FROM k.t WHERE pk = 0"))))
    print(f"{ROWS} x {ROW_BYTES} B: DELETE answered in {t_del*1000:.2f} ms; "
          f"a read sent right after answered in {t_read*1000:.2f} ms; rows left visible: {n}")
    cluster.shutdown()
finally:
    proc.terminate()
    proc.wait(timeout=60)
    shutil.rmtree(DATA, ignore_errors=True)
