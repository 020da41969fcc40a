#!/usr/bin/env bash
# Instructions per request on the real request pipeline over an in-memory connection
# (crates/server/tests/support/request_path.rs), by outcome, under callgrind:
# each path runs N and 2N iterations and the difference / N is its per-request cost (start-up
# and warm-up cancel out). Only the measured loop's own thread counts (--toggle-collect), not
# storage's background threads. Prints each path and its ratio to the served single-partition write.
# Goals: overloaded <= 2%, rate_limited and expired <= 10%. served_limited is a
# served write on a table with a limit it never reaches: the limiter's accounting cost.
# served_auth is the served write with the password authenticator and the Cassandra
# authorizer on, by a role granted MODIFY (issue 28: <= 2% more than served).
# read and read_tables are single-partition reads of 10,000 partitions, from the memtable and
# from 4 disk tables: what a read costs, for changes to the read path. read_spread reads from
# 4 disk tables that each hold a quarter of the partitions; read_narrow and read_narrow_spread
# are read and read_spread on a table without clustering columns.
#
# With CACHE=1 it also simulates the caches (callgrind --cache-sim=yes, this machine's cache
# sizes) and prints the first-level and last-level data-cache misses per request: a skiplist
# or tree search costs its misses more than its instructions, and simulated misses repeat.
#
# Usage: [PATHS="served read ..."] [CACHE=1] scripts/insns.sh [N]   (default 2000; needs valgrind)
set -euo pipefail
N=${1:-2000}
PATHS=${PATHS:-served served_limited served_auth overloaded rate_limited expired write read read_tables read_spread read_narrow read_narrow_spread}
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --quiet --release -p sluice-server --example request_path_insns
BIN=$CARGO_TARGET_DIR/release/examples/request_path_insns

CACHE=${CACHE:-0}
SIM=()
[ "$CACHE" = 1 ] && SIM=(--cache-sim=yes)

# path iterations -> "Ir D1-misses LL-data-misses" (the misses are 0 without CACHE=1)
collected() {
    valgrind --tool=callgrind --fair-sched=yes "${SIM[@]}" --toggle-collect='*request_path_insns::measured*' --callgrind-out-file=/dev/null "$BIN" "$1" "$2" 2>&1 >/dev/null |
        sed -n 's/.*Collected : \(.*\)/\1/p' |
        # events: Ir [Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw]
        awk '{ if (NF >= 9) print $1, $5 + $6, $8 + $9; else print $1, 0, 0 }'
}

declare -A per d1 ll
for path in $PATHS; do
    read -r ia da la <<<"$(collected "$path" "$N")"
    read -r ib db lb <<<"$(collected "$path" $((2 * N)))"
    per[$path]=$(((ib - ia) / N))
    d1[$path]=$(awk -v a="$da" -v b="$db" -v n="$N" 'BEGIN { printf "%.1f", (b - a) / n }')
    ll[$path]=$(awk -v a="$la" -v b="$lb" -v n="$N" 'BEGIN { printf "%.1f", (b - a) / n }')
done
if [ "$CACHE" = 1 ]; then
    printf '%-14s %14s %10s %10s %10s\n' path insns/request 'vs served' 'D1 misses' 'LL misses'
else
    printf '%-14s %14s %10s\n' path insns/request 'vs served'
fi
for path in $PATHS; do
    awk -v p="$path" -v i="${per[$path]}" -v s="${per[served]:-${per[$path]}}" \
        -v d="${d1[$path]}" -v l="${ll[$path]}" -v c="$CACHE" \
        'BEGIN { printf "%-14s %14d %9.2f%%", p, i, 100 * i / s;
                 if (c == 1) printf " %10s %10s", d, l; printf "\n" }'
done
