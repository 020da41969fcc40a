"""Usage: stream_load.py CQL_PORT ROWS VALUE_BYTES

Loads ROWS rows of VALUE_BYTES random bytes into m.t (SimpleStrategy RF 1) of a local Sluice
cluster through the driver's token-aware policy, so that each row lands on its owner."""
import sys, os, time
from cassandra.cluster import Cluster, ExecutionProfile, EXEC_PROFILE_DEFAULT
from cassandra.policies import TokenAwarePolicy, RoundRobinPolicy
from cassandra.concurrent import execute_concurrent_with_args

port, rows, value = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
profile = ExecutionProfile(load_balancing_policy=TokenAwarePolicy(RoundRobinPolicy()), request_timeout=30)
cluster = Cluster(["127.0.0.1"], port=port, execution_profiles={EXEC_PROFILE_DEFAULT: profile}, protocol_version=4)
s = cluster.connect()
s.execute("CREATE KEYSPACE IF NOT EXISTS m WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}")
s.execute("CREATE TABLE IF NOT EXISTS m.t (k int PRIMARY KEY, v blob)")
time.sleep(1)
cluster.refresh_schema_metadata()
ins = s.prepare("INSERT INTO m.t (k, v) VALUES (?, ?)")
blob = os.urandom(value)
start = time.time()
done = 0
for base in range(0, rows, 2000):
    args = [(k, blob) for k in range(base, min(rows, base + 2000))]
    for ok, res in execute_concurrent_with_args(s, ins, args, concurrency=16, raise_on_first_error=False):
        if not ok:
            raise SystemExit(f"insert failed: {res}")
    done += len(args)
print(f"loaded {done} rows of {value} bytes in {time.time() - start:.1f} s")
cluster.shutdown()
