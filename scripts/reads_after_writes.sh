#!/usr/bin/env bash
# Reads after writes, Sluice and Cassandra 5.0 side by side with latte (issue 25): a
# 100,000-row table (latte's stock basic workload), 256 requests in flight, both servers on
# periodic durability (10 s), each paused (SIGSTOP) while the other runs. For each server:
# reads over the loaded keys, then WRITE_SECS of writes as fast as it takes them (new keys,
# latte's write.rn), then the same reads again. Prints latte's summary of every step; the
# reports are kept under WORK.
#
# Usage: scripts/reads_after_writes.sh   (needs target/release/sluice, latte in PATH, and no
# other Cassandra running; env: WORK, SLUICE_PORT, CQL_PORT, STORAGE_PORT, JMX_PORT, READ_SECS,
# WRITE_SECS, ANCHOR_DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/tmp/sluice-reads-after-writes}
SLUICE_PORT=${SLUICE_PORT:-9242}
CQL_PORT=${CQL_PORT:-9142}
READ_SECS=${READ_SECS:-30}
WRITE_SECS=${WRITE_SECS:-60}
ANCHOR_DIR=${ANCHOR_DIR:-/work/shared/anchors/cassandra}
BIN=target/release/sluice
WORKLOADS=$(ls -d "$HOME"/.cargo/registry/src/*/latte-cli-*/workloads/basic | tail -1)
# Ports of their own, away from other nodes' defaults (7000, 7199).
export ANCHOR=$WORK/cassandra CQL_PORT STORAGE_PORT=${STORAGE_PORT:-7142} JMX_PORT=${JMX_PORT:-7143}

mkdir -p "$WORK"
export LATTE_LOG_DIR=$WORK
rm -rf "$WORK/sluice-data"
SLUICE_PID=
CASSANDRA_PID=
cleanup() {
    [ -n "$SLUICE_PID" ] && { kill -CONT "$SLUICE_PID" 2>/dev/null; kill "$SLUICE_PID" 2>/dev/null; wait "$SLUICE_PID" 2>/dev/null || true; }
    [ -n "$CASSANDRA_PID" ] && { kill -CONT "$CASSANDRA_PID" 2>/dev/null; "$ANCHOR_DIR/stop.sh" || true; }
}
trap cleanup EXIT

"$BIN" serve --listen "127.0.0.1:$SLUICE_PORT" --internode-listen "127.0.0.1:$((SLUICE_PORT + 1))" \
    --data-dir "$WORK/sluice-data" --durability periodic --periodic-sync-ms 10000 \
    --shard-aware-port off --metrics-listen off >"$WORK/sluice.log" 2>&1 &
SLUICE_PID=$!
FRESH=1 "$ANCHOR_DIR/start.sh"
CASSANDRA_PID=$(cat "$ANCHOR/cassandra.pid")

# step NAME PID ADDR WORKLOAD SECS: runs one latte step against one server, the other paused.
step() {
    local name=$1 pid=$2 addr=$3 workload=$4 secs=$5 other
    other=$([ "$pid" = "$SLUICE_PID" ] && echo "$CASSANDRA_PID" || echo "$SLUICE_PID")
    kill -STOP "$other"
    kill -CONT "$pid"
    sleep 1
    echo "== $name"
    latte run "$WORKLOADS/$workload" -d "${secs}s" -t 1 -p 256 -o "$WORK/$name.json" "$addr" \
        >"$WORK/$name.txt" 2>&1
    grep -E "Throughput|Mean resp|^ *(50|99|99\.9) " "$WORK/$name.txt" | head -8 || true
}

for server in sluice cassandra; do
    if [ $server = sluice ]; then pid=$SLUICE_PID addr=127.0.0.1:$SLUICE_PORT; else pid=$CASSANDRA_PID addr=127.0.0.1:$CQL_PORT; fi
    other=$([ "$pid" = "$SLUICE_PID" ] && echo "$CASSANDRA_PID" || echo "$SLUICE_PID")
    kill -STOP "$other"
    kill -CONT "$pid"
    latte schema "$WORKLOADS/read.rn" "$addr" >"$WORK/$server-schema.txt" 2>&1
    latte load "$WORKLOADS/read.rn" "$addr" >"$WORK/$server-load.txt" 2>&1
done
for server in sluice cassandra; do
    if [ $server = sluice ]; then pid=$SLUICE_PID addr=127.0.0.1:$SLUICE_PORT; else pid=$CASSANDRA_PID addr=127.0.0.1:$CQL_PORT; fi
    step "$server-reads-before" "$pid" "$addr" read.rn "$READ_SECS"
done
for server in sluice cassandra; do
    if [ $server = sluice ]; then pid=$SLUICE_PID addr=127.0.0.1:$SLUICE_PORT; else pid=$CASSANDRA_PID addr=127.0.0.1:$CQL_PORT; fi
    step "$server-writes" "$pid" "$addr" write.rn "$WRITE_SECS"
    step "$server-reads-after" "$pid" "$addr" read.rn "$READ_SECS"
done
