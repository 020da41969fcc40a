#!/usr/bin/env bash
# The LWT convoy, before and after, in one run: LWT/s and latency of INSERT ... IF NOT EXISTS
# on distinct partitions against `sluice serve` in batch durability, once with
# --lwt-serialize-through-durability on (each LWT holds one of 64 lock stripes until its
# write is durable, as LWTs did before their condition moved into the storage commit) and
# once off (the default: the condition is checked under the partition's stripe locks inside
# the commit, and concurrent LWTs share a group fsync). Admission control is off, so that
# every request runs and the figures are those of the LWT path, not of shedding. The modes
# alternate ROUNDS times,
# each on a fresh server and data directory, so that a drift of the machine shows.
# `sluice-lwt-convoy` (crates/bench/src/lwt_convoy.rs) is the client: closed loop,
# CONCURRENCY requests in flight over 4 connections, a 2 s warm-up then MEASURE_SECONDS measured.
# Then the same for plain INSERTs into a table with transactional_mode 'off' and 'full'.
#
# Usage: [CONCURRENCY=256] [MEASURE_SECONDS=10] [ROUNDS=2] [SHARDS=2] [NO_BUILD=1] scripts/lwt-convoy.sh
# (NO_BUILD=1: use the release binaries already built)
set -euo pipefail
CONCURRENCY=${CONCURRENCY:-256}
SECONDS_MEASURED=${MEASURE_SECONDS:-10}
ROUNDS=${ROUNDS:-2}
SHARDS=${SHARDS:-2}
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
BIN=$CARGO_TARGET_DIR/release

WORK=$(mktemp -d /tmp/sluice-lwt-convoy.XXXXXX)
if [ "${NO_BUILD:-0}" != 1 ] && ! cargo build --release -p sluice -p sluice-bench \
    --bin sluice --bin sluice-lwt-convoy >"$WORK/build.log" 2>&1; then
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

echo "batch durability, $SHARDS shards, $CONCURRENCY in flight, ${SECONDS_MEASURED} s per run"
for round in $(seq 1 "$ROUNDS"); do
    for mode in on off; do
        port=$(free_port)
        rm -rf "$WORK/data"
        "$BIN/sluice" serve --listen "127.0.0.1:$port" --data-dir "$WORK/data" \
            --shards "$SHARDS" --shard-aware-port off --metrics-listen off --log warn \
            --durability batch --admission off --lwt-serialize-through-durability "$mode" \
            >"$WORK/server.log" 2>&1 &
        SERVER=$!
        wait_listening "$port" "$SERVER" "$WORK/server.log"
        "$BIN/sluice-lwt-convoy" --node "127.0.0.1:$port" --concurrency "$CONCURRENCY" \
            --seconds "$SECONDS_MEASURED" --label "round $round, serialize-through-durability $mode"
        kill -TERM "$SERVER"
        wait "$SERVER" 2>/dev/null || true
        SERVER=
    done
done

# The cost of transactional_mode = 'full' for plain writes (commit-assigned timestamps):
# plain INSERTs of fresh keys into a table with the mode off, then one with it full.
echo "plain writes, transactional_mode off vs full"
for round in $(seq 1 "$ROUNDS"); do
    for tmode in off full; do
        port=$(free_port)
        rm -rf "$WORK/data"
        "$BIN/sluice" serve --listen "127.0.0.1:$port" --data-dir "$WORK/data" \
            --shards "$SHARDS" --shard-aware-port off --metrics-listen off --log warn \
            --durability batch --admission off >"$WORK/server.log" 2>&1 &
        SERVER=$!
        wait_listening "$port" "$SERVER" "$WORK/server.log"
        "$BIN/sluice-lwt-convoy" --node "127.0.0.1:$port" --concurrency "$CONCURRENCY" \
            --seconds "$SECONDS_MEASURED" --plain --transactional-mode "$tmode" \
            --label "round $round, plain INSERT, transactional_mode $tmode"
        kill -TERM "$SERVER"
        wait "$SERVER" 2>/dev/null || true
        SERVER=
    done
done
