"""One partition written far above its write limit through a 3-node RF 3 cluster, plus
writes to other partitions; prints the accepted rate of each and the hot partition's per second.

Usage: python hot_write_limit.py token-aware|round-robin LIMIT SECONDS, with three nodes on
127.0.0.1-3, CQL port 29042 (see docs/decisions/2026-11-26-rate-limit-decided-once.md).
Drops and recreates rl.t."""
import sys, time, random, threading
from cassandra.cluster import Cluster, ExecutionProfile, EXEC_PROFILE_DEFAULT
from cassandra.policies import RoundRobinPolicy, TokenAwarePolicy, FallthroughRetryPolicy
from cassandra import ConsistencyLevel

lb, limit, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
policy = RoundRobinPolicy() if lb == "round-robin" else TokenAwarePolicy(RoundRobinPolicy(), shuffle_replicas=True)
prof = ExecutionProfile(load_balancing_policy=policy, retry_policy=FallthroughRetryPolicy(),
                        consistency_level=ConsistencyLevel.ONE, request_timeout=5)
c = Cluster(["127.0.0.1", "127.0.0.2", "127.0.0.3"], port=29042, protocol_version=4,
            execution_profiles={EXEC_PROFILE_DEFAULT: prof})
s = c.connect()
s.execute("CREATE KEYSPACE IF NOT EXISTS rl WITH replication = {'class':'SimpleStrategy','replication_factor':3}")
s.execute("DROP TABLE IF EXISTS rl.t")
s.execute("CREATE TABLE rl.t (pk int PRIMARY KEY, v int) WITH per_partition_rate_limit = {'max_writes_per_second': %d}" % limit)
time.sleep(1)
ins = s.prepare("INSERT INTO rl.t (pk, v) VALUES (?, ?)")
hot = {"ok": 0, "limited": 0, "other_err": 0, "sent": 0}
cold = {"ok": 0, "limited": 0, "other_err": 0, "sent": 0}
lock = threading.Lock()
sem = threading.Semaphore(24)
def done(stats):
    def ok(_):
        with lock:
            stats["ok"] += 1
            if stats is hot: per_sec[int(time.time() - start)] = per_sec.get(int(time.time() - start), 0) + 1
        sem.release()
    def err(e):
        with lock:
            if "rate limit" in str(e).lower() or "rate_limit" in str(e).lower() or type(e).__name__ in ("ConfigurationException", "RateLimitReached"):
                stats["limited"] += 1
            else:
                stats["other_err"] += 1
                if stats["other_err"] < 3: print("error:", type(e).__name__, e)
        sem.release()
    return ok, err
per_sec = {}
start = time.time()
i = 0
while time.time() - start < secs:
    sem.acquire()
    i += 1
    if i % 5 == 0:
        stats, key = cold, random.randrange(1, 1_000_000)
    else:
        stats, key = hot, 0
    stats["sent"] += 1
    f = s.execute_async(ins, (key, i))
    ok, err = done(stats)
    f.add_callbacks(ok, err)
for _ in range(24): sem.acquire()
el = time.time() - start
print(f"{lb}: limit {limit}/s, {el:.1f} s; hot offered {hot['sent']/el:.0f}/s accepted {hot['ok']/el:.1f}/s "
      f"({(hot['ok']/el/limit-1)*100:+.0f}% vs limit), rate-limited {hot['limited']}, other errors {hot['other_err']}; "
      f"other partitions offered {cold['sent']/el:.0f}/s accepted {cold['ok']/el:.1f}/s ({cold['ok']/max(1,cold['sent'])*100:.1f}%), errors {cold['limited']}+{cold['other_err']}")
secs_list = [per_sec.get(k, 0) for k in range(int(secs))]
print("hot accepted per second:", secs_list, "mean after the first second: %.1f" % (sum(secs_list[1:]) / max(1, len(secs_list) - 1)))
c.shutdown()
