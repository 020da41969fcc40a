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
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
BIN=$CARGO_TARGET_DIR/release

WORK=$(mktemp -d /tmp/sluice-txn-sweep.XXXXXX)
if [ "${NO_BUILD:-0}" != 1 ] && ! cargo build --release -p sluice -p sluice-bench \
    --bin sluice --bin sluice-txn-sweep >"$WORK/build.log" 2>&1; then
    cat "$WORK/build.log" >&2
    exit 1
fi
SERVER=
cleanup() {
    if [ -n "$SERVER" ]; then kill -KILL "$SERVER" 2>/dev/null || true; fi
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_listening() {
    local port=$1 pid=$2 log=$3
    for _ in $(seq 1 300); do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "server exited early:" >&2
            cat "$log" >&2
            exit 1
        fi
        if python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2)" 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    echo "server on port $port did not listen within 30 s" >&2
    exit 1
}

echo "$DURABILITY durability, $SHARDS shards, $KEYS accounts, ${SECONDS_MEASURED} s per step"
for mode in on off; do
    port=$(free_port)
    metrics=$(free_port)
    rm -rf "$WORK/data"
    "$BIN/sluice" serve --listen "127.0.0.1:$port" --data-dir "$WORK/data" \
        --shards "$SHARDS" --shard-aware-port off --metrics-listen "127.0.0.1:$metrics" \
        --log warn --durability "$DURABILITY" --admission off --txn-adaptive-limit "$mode" \
        >"$WORK/server.log" 2>&1 &
    SERVER=$!
    wait_listening "$port" "$SERVER" "$WORK/server.log"
    "$BIN/sluice-txn-sweep" --node "127.0.0.1:$port" --metrics "127.0.0.1:$metrics" \
        --clients "$CLIENTS" --keys "$KEYS" --seconds "$SECONDS_MEASURED" \
        --label "adaptive limit $mode"
    kill -TERM "$SERVER"
    wait "$SERVER" 2>/dev/null || true
    SERVER=
done
