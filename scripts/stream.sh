#!/usr/bin/env bash
# Streaming figures on the real binary: three `sluice serve` nodes on 127.0.0.1-3 (debug build,
# one shard, 8 tokens, periodic durability), ROWS rows of VALUE random bytes loaded into `m.t`
# (SimpleStrategy RF 1) by the Python driver's token-aware policy (scripts/stream_load.py), so
# that each row lands on its owner; then a fourth node joins (its log gives the bytes and
# seconds of each pass), `sluice nodetool status`, `sluice nodetool decommission` of the fourth
# node timed, and status again. The data directory (DIR) is removed at the end unless KEEP=1.
#
# With LOAD=1 instead: a token-aware writer (scripts/stream_under_load.py, 8 in flight) inserts
# rows into `m.w` (RF 1) for 12 s while the fourth node joins (3 s in), then checks that every
# acknowledged row is in the local data of its replica on the four-node ring; then the same
# while the fourth node is decommissioned, checked on the three-node ring.
#
# Usage: [ROWS=100000] [VALUE=2000] [DIR=/tmp/sluice-stream] [KEEP=1] [LOAD=1] scripts/stream.sh
set -u
cd "$(dirname "$0")/.."
cargo build -p sluice >/dev/null || exit 1
BIN=$PWD/target/debug/sluice
PY=$PWD/.venv/cassandra/bin/python
DIR=${DIR:-/tmp/sluice-stream}
ROWS=${ROWS:-100000}
VALUE=${VALUE:-2000}
CQL=${CQL_PORT:-31042}; SA=${SHARD_AWARE_PORT:-31142}; IN=${INTERNODE_PORT:-31700}
rm -rf "$DIR"; mkdir -p "$DIR"
stop_all() {
  for i in 1 2 3 4; do [ -f "$DIR/node$i.pid" ] && kill "$(cat "$DIR/node$i.pid")" 2>/dev/null; done
  sleep 3
  [ -n "${KEEP:-}" ] || rm -rf "$DIR"
}
start() {
  local i=$1; shift
  "$BIN" serve --listen 127.0.0.$i:$CQL --shard-aware-port $SA --internode-listen 127.0.0.$i:$IN \
    --metrics-listen off --shards 1 --num-tokens 8 --durability periodic \
    --data-dir "$DIR/node$i" "$@" > "$DIR/node$i.log" 2>&1 &
  echo $! > "$DIR/node$i.pid"
  for _ in $(seq 1 600); do
    (exec 3<>/dev/tcp/127.0.0.$i/$CQL) 2>/dev/null && return 0
    sleep 0.1
  done
  echo "node $i did not open its CQL port; see $DIR/node$i.log"; stop_all; exit 1
}
start 1
start 2 --seeds 127.0.0.1:$IN
start 3 --seeds 127.0.0.1:$IN
if [ -n "${LOAD:-}" ]; then
  W="$PY scripts/stream_under_load.py"
  $W write $CQL 12 "$DIR/acked-join" & writer=$!
  sleep 3
  start 4 --seeds 127.0.0.1:$IN
  wait $writer
  sleep 1
  $W check $CQL 4 "$DIR/acked-join"
  $W write $CQL 12 "$DIR/acked-leave" & writer=$!
  sleep 3
  "$BIN" nodetool --host 127.0.0.4:$IN decommission
  wait $writer
  sleep 1
  $W check $CQL 3 "$DIR/acked-leave"
  stop_all
  exit 0
fi
"$PY" scripts/stream_load.py $CQL "$ROWS" "$VALUE" || { echo "load failed"; stop_all; exit 1; }
"$BIN" nodetool --host 127.0.0.1:$IN status
t0=$(date +%s.%N)
start 4 --seeds 127.0.0.1:$IN
t1=$(date +%s.%N)
echo "node 4 start to open CQL port: $(echo "$t1 - $t0" | bc) s"
grep -h "streamed the ranges\|pulled the joined\|joined the ring" "$DIR/node4.log" | sed 's/\x1b\[[0-9;]*m//g'
"$BIN" nodetool --host 127.0.0.1:$IN status
t0=$(date +%s.%N)
"$BIN" nodetool --host 127.0.0.4:$IN decommission
t1=$(date +%s.%N)
echo "decommission: $(echo "$t1 - $t0" | bc) s"
sleep 2
"$BIN" nodetool --host 127.0.0.1:$IN status
stop_all
