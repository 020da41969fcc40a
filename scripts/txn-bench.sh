#!/usr/bin/env bash
# Issue 27's transaction benchmarks as `sluice-bench bench` scenarios (crates/bench/src/txn_bench.rs),
# each on fresh `sluice serve` nodes (admission off, so that the transaction path is measured and
# not shedding; DURABILITY for both), and beside Cassandra's LWT when CASSANDRA is given:
#
# - ravendb:  two-partition transactions carrying VALUES-byte values, against a node that
#             prepares the writes before the locks (the default) and one that prepares them
#             under the locks (--txn-prepare-under-lock on), alternating, and the ratio; then
#             the same with large-value LWTs on Sluice and on CASSANDRA.
# - gsuneido: 1 to 30 clients of short read-modify-write transactions on 10 accounts, with the
#             adaptive limit on and off; then the LWT form (compare-and-set increments) on
#             Sluice and on CASSANDRA.
# - hot-rows: the best concurrency on 4 hot accounts, then 64x it, limit on and off; then the
#             LWT form on Sluice and on CASSANDRA.
#
# FORMS="lwt" runs only the LWT part (Sluice and CASSANDRA).
#
# Usage: [SCENARIOS="ravendb gsuneido hot-rows"] [FORMS="accord lwt"] [CASSANDRA=127.0.0.1:9142] [STEP=5s]
#        [VALUES=102400,1048576] [SHARDS=2] [DURABILITY=periodic] [NO_BUILD=1] scripts/txn-bench.sh
set -euo pipefail
SCENARIOS=${SCENARIOS:-ravendb gsuneido hot-rows}
FORMS=${FORMS:-accord lwt}
CASSANDRA=${CASSANDRA:-}
STEP=${STEP:-5s}
VALUES=${VALUES:-102400,1048576}
SHARDS=${SHARDS:-2}
DURABILITY=${DURABILITY:-periodic}
cd "$(dirname "$0")/.."
. scripts/lib/serve.sh
serve_setup txn-bench sluice sluice-bench

NODES=()
stop_nodes() {
    for pid in "${NODES[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${NODES[@]}"; do wait "$pid" 2>/dev/null || true; done
    NODES=()
    rm -rf "$WORK"/node-*
}
trap 'stop_nodes; serve_cleanup' EXIT

# start_node NAME PORT METRICS ARG...: a fresh node in WORK/node-NAME.
start_node() {
    local name=$1 port=$2 metrics=$3
    shift 3
    "$BIN/sluice" serve --listen "127.0.0.1:$port" --data-dir "$WORK/node-$name" \
        --internode-listen "127.0.0.1:$(free_port)" --metrics-listen "127.0.0.1:$metrics" --shards "$SHARDS" --shard-aware-port off \
        --log warn --admission off --durability "$DURABILITY" "$@" >"$WORK/$name.log" 2>&1 &
    NODES+=($!)
    wait_listening "$port" "$!" "$WORK/$name.log"
}

bench() { "$BIN/sluice-bench" bench "$@" --step "$STEP"; }

echo "$DURABILITY durability, $SHARDS shards, admission off, $STEP per step; load: $(cut -d' ' -f1-3 /proc/loadavg)"
for scenario in $SCENARIOS; do
    a=$(free_port); am=$(free_port); b=$(free_port); bm=$(free_port)
    case $scenario in
    ravendb)
        start_node a "$a" "$am"
        start_node b "$b" "$bm" --txn-prepare-under-lock on
        [[ " $FORMS " == *" accord "* ]] && bench ravendb --txn-value-bytes "$VALUES" \
            --nodes "127.0.0.1:$a" --label "prepare before the locks" \
            --against "127.0.0.1:$b" --against-label "prepare under the locks" \
            --txn-metrics "127.0.0.1:$am,127.0.0.1:$bm"
        ;;
    gsuneido | hot-rows)
        start_node a "$a" "$am"
        start_node b "$b" "$bm" --txn-adaptive-limit off
        [[ " $FORMS " == *" accord "* ]] && bench "$scenario" --nodes "127.0.0.1:$a" --label "limit on" \
            --against "127.0.0.1:$b" --against-label "limit off" \
            --txn-metrics "127.0.0.1:$am,127.0.0.1:$bm"
        ;;
    *)
        echo "unknown scenario $scenario" >&2
        exit 1
        ;;
    esac
    echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
    if [ -n "$CASSANDRA" ] && [[ " $FORMS " == *" lwt "* ]]; then
        extra=()
        if [ "$scenario" = ravendb ]; then extra=(--txn-value-bytes "$VALUES"); fi
        bench "$scenario" --txn-form lwt "${extra[@]}" \
            --nodes "127.0.0.1:$a" --label "sluice lwt" --txn-metrics "127.0.0.1:$am" \
            --against "$CASSANDRA" --against-label "cassandra lwt"
        echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
    fi
    stop_nodes
done
