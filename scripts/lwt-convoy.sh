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
. scripts/lib/serve.sh
serve_setup lwt-convoy sluice sluice-lwt-convoy

echo "batch durability, $SHARDS shards, $CONCURRENCY in flight, ${SECONDS_MEASURED} s per run"
for round in $(seq 1 "$ROUNDS"); do
    for mode in on off; do
        port=$(free_port)
        serve_start "$port" --metrics-listen off --durability batch --admission off \
            --lwt-serialize-through-durability "$mode"
        "$BIN/sluice-lwt-convoy" --node "127.0.0.1:$port" --concurrency "$CONCURRENCY" \
            --seconds "$SECONDS_MEASURED" --label "round $round, serialize-through-durability $mode"
        serve_stop
    done
done

# The cost of transactional_mode = 'full' for plain writes (commit-assigned timestamps):
# plain INSERTs of fresh keys into a table with the mode off, then one with it full.
echo "plain writes, transactional_mode off vs full"
for round in $(seq 1 "$ROUNDS"); do
    for tmode in off full; do
        port=$(free_port)
        serve_start "$port" --metrics-listen off --durability batch --admission off
        "$BIN/sluice-lwt-convoy" --node "127.0.0.1:$port" --concurrency "$CONCURRENCY" \
            --seconds "$SECONDS_MEASURED" --plain --transactional-mode "$tmode" \
            --label "round $round, plain INSERT, transactional_mode $tmode"
        serve_stop
    done
done
