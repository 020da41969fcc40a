#!/usr/bin/env bash
# Instructions per request on the in-process request path, by outcome, under callgrind:
# each path runs N and 2N iterations and the difference / N is its per-request cost (start-up
# and warm-up cancel out). Only the measured loop's own thread counts (--toggle-collect), not
# storage's background threads. Prints each path and its ratio to the served single-partition write.
# Goals (issue 4): overloaded <= 2%, rate_limited and expired <= 10%. served_limited is a
# served write on a table with a limit it never reaches: the limiter's accounting cost.
# read and read_tables are single-partition reads of 10,000 partitions, from the memtable and
# from 4 disk tables: what a read costs, for changes to the read path.
#
# Usage: [PATHS="served read ..."] scripts/insns.sh [N]   (default 2000; needs valgrind)
set -euo pipefail
N=${1:-2000}
PATHS=${PATHS:-served served_limited overloaded rate_limited expired read read_tables}
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --quiet --release -p sluice-server --example request_path_insns
BIN=$CARGO_TARGET_DIR/release/examples/request_path_insns

collected() { # path iterations -> total instructions
    valgrind --tool=callgrind --fair-sched=yes --toggle-collect='*request_path_insns::measured*' --callgrind-out-file=/dev/null "$BIN" "$1" "$2" 2>&1 >/dev/null |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}

declare -A per
for path in $PATHS; do
    a=$(collected "$path" "$N")
    b=$(collected "$path" $((2 * N)))
    per[$path]=$(((b - a) / N))
done
printf '%-14s %14s %10s\n' path insns/request 'vs served'
for path in $PATHS; do
    awk -v p="$path" -v i="${per[$path]}" -v s="${per[served]}" \
        'BEGIN { printf "%-14s %14d %9.2f%%\n", p, i, 100 * i / s }'
done
