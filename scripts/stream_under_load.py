"""Usage: stream_under_load.py write CQL_PORT SECONDS OUT | check CQL_PORT NODES OUT

write: inserts rows k = 0, 1, 2, ... into m.w (SimpleStrategy RF 1, created if missing) for
SECONDS, token-aware, 8 in flight, and writes the keys whose insert was acknowledged to OUT.
check: reads each node's local data of m.w (127.0.0.1 .. 127.0.0.NODES, one node at a time:
there is no coordinator, so a node answers from its own data) and the server's replica of
each acknowledged key (system_views.token_replicas on node 1), and prints how many
acknowledged keys are missing from their replica."""
import sys, time, threading
from cassandra.cluster import Cluster, ExecutionProfile, EXEC_PROFILE_DEFAULT
from cassandra.policies import TokenAwarePolicy, RoundRobinPolicy, WhiteListRoundRobinPolicy
from cassandra.metadata import Murmur3Token
from cassandra.concurrent import execute_concurrent_with_args
import struct


def connect(port, policy, contact="127.0.0.1"):
    profile = ExecutionProfile(load_balancing_policy=policy, request_timeout=10)
    c = Cluster([contact], port=port, protocol_version=4,
                execution_profiles={EXEC_PROFILE_DEFAULT: profile})
    return c, c.connect()


def write(port, seconds, out):
    cluster, s = connect(port, TokenAwarePolicy(RoundRobinPolicy()))
    s.execute("CREATE KEYSPACE IF NOT EXISTS m WITH replication = "
              "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    s.execute("CREATE TABLE IF NOT EXISTS m.w (k int PRIMARY KEY, v text)")
    time.sleep(1)
    ins = s.prepare("INSERT INTO m.w (k, v) VALUES (?, ?)")
    acked, failed, lock = [], [0], threading.Lock()
    end = time.time() + seconds
    next_key = [0]

    def worker():
        while time.time() < end:
            with lock:
                k = next_key[0]
                next_key[0] += 1
            try:
                s.execute(ins, (k, "x" * 100))
                with lock:
                    acked.append(k)
            except Exception:
                with lock:
                    failed[0] += 1

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(out, "w") as f:
        f.write("\n".join(map(str, sorted(acked))))
    print(f"write: {len(acked)} acknowledged, {failed[0]} failed in {seconds} s")
    cluster.shutdown()


def check(port, nodes, out):
    acked = [int(x) for x in open(out).read().split()]
    local = {}
    for i in range(1, nodes + 1):
        ip = f"127.0.0.{i}"
        c, s = connect(port, WhiteListRoundRobinPolicy([ip]), ip)
        keys = {row.k for row in s.execute("SELECT k FROM m.w")}
        local[ip] = keys
        c.shutdown()
    c, s = connect(port, WhiteListRoundRobinPolicy(["127.0.0.1"]))
    lookup = s.prepare("SELECT replicas FROM system_views.token_replicas "
                       "WHERE keyspace_name = 'm' AND token_value = ?")
    tokens = [(Murmur3Token.from_key(struct.pack(">i", k)).value,) for k in acked]
    missing = []
    for k, (ok, res) in zip(acked, execute_concurrent_with_args(s, lookup, tokens, concurrency=32)):
        if not ok:
            raise SystemExit(f"lookup failed: {res}")
        replicas = [str(ip) for ip in res.one().replicas]
        if not any(k in local.get(r, ()) for r in replicas):
            missing.append((k, replicas))
    c.shutdown()
    on_replica = len(acked) - len(missing)
    print(f"check: {len(acked)} acknowledged keys, {len(missing)} missing from their replica"
          + (f" (keys {min(k for k, _ in missing)} .. {max(k for k, _ in missing)}; "
             f"last acknowledged {max(acked)})" if missing else ""))


if sys.argv[1] == "write":
    write(int(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
else:
    check(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
