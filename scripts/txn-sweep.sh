#!/usr/bin/env bash
# gSuneido's experiment in CQL: short read-modify-write transactions (BEGIN TRANSACTION, two
# LETs, `n = n + d` and `n = n - d` on two of KEYS accounts) from 1 to 30 closed-loop
# clients, with the adaptive limit on outstanding transactions on, then off
# (--txn-adaptive-limit), each on a fresh server and data directory. `sluice-txn-sweep`
# (crates/bench/src/txn_sweep.rs) is the client; it prints transactions/s, p99, timeouts,
# the most transactions the server ran at once (sampled from GET /metrics) and the limit,
# then checks that the accounts still sum to 0.
#
# Usage: [CLIENTS=1,2,3,4,5,6,8,10,16,20,30] [KEYS=10] [MEASURE_SECONDS=5] [SHARDS=2]
#        [DURABILITY=periodic] [NO_BUILD=1] scripts/txn-sweep.sh
set -euo pipefail
CLIENTS=${CLIENTS:-1,2,3,4,5,6,8,10,16,20,30}
KEYS=${KEYS:-10}
SECONDS_MEASURED=${MEASURE_SECONDS:-5}
SHARDS=${SHARDS:-2}
DURABILITY=${DURABILITY:-periodic}
cd "$(dirname "$0")/.."
. scripts/lib/serve.sh
serve_setup txn-sweep sluice sluice-txn-sweep

echo "$DURABILITY durability, $SHARDS shards, $KEYS accounts, ${SECONDS_MEASURED} s per step"
for mode in on off; do
    port=$(free_port)
    metrics=$(free_port)
    serve_start "$port" --metrics-listen "127.0.0.1:$metrics" --durability "$DURABILITY" \
        --admission off --txn-adaptive-limit "$mode"
    "$BIN/sluice-txn-sweep" --node "127.0.0.1:$port" --metrics "127.0.0.1:$metrics" \
        --clients "$CLIENTS" --keys "$KEYS" --seconds "$SECONDS_MEASURED" \
        --label "adaptive limit $mode"
    serve_stop
done
