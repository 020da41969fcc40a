#!/usr/bin/env bash
# Instructions per request by outcome on the real `sluice serve` binary under callgrind.
#
# Builds sluice (release) and starts two servers under `valgrind --tool=callgrind`, one shard
# each, on loopback with free ports and temporary data directories:
#   A  periodic durability, admission on with CoDel's target and interval scaled to a server
#      slowed down ~50x by callgrind (1 s / 10 s), so that 64 in flight are not taken for a
#      standing queue: served, rate-limited and expired writes;
#   B  --durability batch --admission-queue 1 --admission-{min,max}-concurrency 1: nearly
#      every pipelined write is turned away `Overloaded` from its header;
#   C  as A, with --authenticator password --authorizer cassandra: the served write by a role
#      that logged in and holds MODIFY through a GRANT (goal: at most 2% more than on A).
# `sluice-cost-phase` (crates/bench/src/cost.rs, `--help`) drives them with the stock Rust
# scylla driver, IN_FLIGHT requests pipelined on one connection, and brackets each phase with
# `callgrind_control --zero` / `--dump`, so start-up, schema changes and warm-up do not count;
# every server thread counts. It prints instructions per request of each outcome, the ratio to
# the served write beside its goal (Overloaded <= 2%, rate-limited and expired <= 10%), and the
# outcome counts of each phase; it exits non-zero when a phase did not produce its outcome.
#
# Usage: [IN_FLIGHT=64] [KEEP=1] scripts/cost.sh [N]   (N requests per phase, default 3000)
set -euo pipefail
N=${1:-3000}
IN_FLIGHT=${IN_FLIGHT:-64}
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
BIN=$CARGO_TARGET_DIR/release

WORK=$(mktemp -d /tmp/sluice-cost.XXXXXX)
if ! cargo build --release -p sluice -p sluice-bench --bin sluice --bin sluice-cost-phase \
    >"$WORK/build.log" 2>&1; then
    cat "$WORK/build.log" >&2
    exit 1
fi
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start NAME EXTRA... : starts a server under callgrind; sets PORT_<NAME> and PID_<NAME>.
start() {
    local name=$1
    shift
    local port internode
    port=$(free_port)
    # Each server its own node-to-node port: the default (7000) would be shared.
    internode=$(free_port)
    mkdir -p "$WORK/$name"
    valgrind --tool=callgrind --fair-sched=yes --callgrind-out-file="$WORK/$name.out" \
        "$BIN/sluice" serve --listen "127.0.0.1:$port" --internode-listen "127.0.0.1:$internode" \
        --data-dir "$WORK/$name/data" \
        --shards 1 --shard-aware-port off --metrics-listen off --log warn "$@" \
        >"$WORK/$name.log" 2>&1 &
    PIDS+=($!)
    printf -v "PORT_$name" %s "$port"
    printf -v "PID_$name" %s "$!"
}

wait_listening() {
    local port=$1 pid=$2 log=$3
    for _ in $(seq 1 600); do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "server exited early:" >&2
            cat "$log" >&2
            exit 1
        fi
        if python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $port), 0.2)" 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    echo "server on port $port did not listen within 60 s" >&2
    exit 1
}

# The event-loop lag probe wakes every 1 ms: under callgrind's ~50x slowdown that is one
# wake-up per few requests instead of one per hundreds, time-driven work that would read as
# per-request cost (and differ between runs with the machine's load); it is off here.
start A --admission-target 1s --admission-interval 10s --admission-lag-probe off
start B --admission-lag-probe off --durability batch --admission-queue 1 --admission-min-concurrency 1 \
    --admission-max-concurrency 1
start C --admission-target 1s --admission-interval 10s --admission-lag-probe off \
    --authenticator password \
    --authorizer cassandra --auth-bcrypt-cost 4
wait_listening "$PORT_A" "$PID_A" "$WORK/A.log"
wait_listening "$PORT_B" "$PID_B" "$WORK/B.log"
wait_listening "$PORT_C" "$PID_C" "$WORK/C.log"

echo "sluice serve under callgrind, 1 shard, $N requests per phase, $IN_FLIGHT in flight (scylla driver)"
started=$(date +%s)
"$BIN/sluice-cost-phase" --requests "$N" --in-flight "$IN_FLIGHT" \
    --node "127.0.0.1:$PORT_A" --pid "$PID_A" --out "$WORK/A.out" \
    --overload-node "127.0.0.1:$PORT_B" --overload-pid "$PID_B" --overload-out "$WORK/B.out" \
    --auth-node "127.0.0.1:$PORT_C" --auth-pid "$PID_C" --auth-out "$WORK/C.out"
echo "phases took $(($(date +%s) - started)) s"
