#!/usr/bin/env bash
# Reads after writes, Sluice and Cassandra 5.0 side by side with latte (issue 25): a
# 100,000-row table (latte's stock basic workload), 256 requests in flight, both servers on
# periodic durability (10 s), each paused (SIGSTOP) while the other runs. For each server:
# reads over the loaded keys, then WRITE_SECS of writes (new keys, latte's write.rn) at
# WRITE_RATE per second, or as fast as each server takes them when it is empty, then the same
# reads again. With WRITE_RATE at a rate both servers sustain, both tables take the same keys,
# which is the comparison issue 25 asks for; as fast as each can, the faster server's table
# grows more. Prints latte's summary of every step; the
# reports are kept under WORK.
#
# With SLUICE_ONLY=1 it runs Sluice alone (no Cassandra started), for before/after
# comparisons of Sluice itself. After each step it prints the CPU seconds the step took in
# Sluice's threads, by group (shards, fjall's flush and compaction workers, other).
#
# Usage: scripts/reads_after_writes.sh   (needs target/release/sluice, latte in PATH, and no
# other Cassandra running; env: WORK, SLUICE_PORT, CQL_PORT, STORAGE_PORT, JMX_PORT, READ_SECS,
# WRITE_SECS, WRITE_RATE, ANCHOR_DIR, SLUICE_ONLY)
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/tmp/sluice-reads-after-writes}
SLUICE_PORT=${SLUICE_PORT:-9242}
CQL_PORT=${CQL_PORT:-9142}
READ_SECS=${READ_SECS:-30}
SLUICE_ONLY=${SLUICE_ONLY:-0}
WRITE_SECS=${WRITE_SECS:-60}
WRITE_RATE=${WRITE_RATE:-}
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
SERVERS="sluice cassandra"
if [ "$SLUICE_ONLY" = 1 ]; then
    SERVERS=sluice
    sleep 2
else
    FRESH=1 "$ANCHOR_DIR/start.sh"
    CASSANDRA_PID=$(cat "$ANCHOR/cassandra.pid")
fi

# Sluice's CPU seconds so far by thread group: "shards fjall other" (utime + stime, all
# threads of the process; the clock tick is 100 Hz).
sluice_cpu() {
    local t name ticks
    declare -A by=([shards]=0 [fjall]=0 [other]=0)
    for t in /proc/"$SLUICE_PID"/task/*; do
        name=$(cat "$t/comm" 2>/dev/null) || continue
        ticks=$(awk '{ s = $0; sub(/.*\) /, "", s); split(s, f, " "); print f[12] + f[13] }' "$t/stat" 2>/dev/null) || continue
        case "$name" in
        sluice-shard*) by[shards]=$((by[shards] + ticks)) ;;
        fjall*) by[fjall]=$((by[fjall] + ticks)) ;;
        *) by[other]=$((by[other] + ticks)) ;;
        esac
    done
    echo "${by[shards]} ${by[fjall]} ${by[other]}"
}

# step NAME PID ADDR WORKLOAD SECS [LATTE ARG...]: runs one latte step against one server, the
# other paused.
step() {
    local name=$1 pid=$2 addr=$3 workload=$4 secs=$5 other
    shift 5
    other=$([ "$pid" = "$SLUICE_PID" ] && echo "$CASSANDRA_PID" || echo "$SLUICE_PID")
    [ -n "$other" ] && kill -STOP "$other"
    kill -CONT "$pid"
    sleep 1
    echo "== $name (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    local before after
    before=$(sluice_cpu)
    latte run "$WORKLOADS/$workload" -d "${secs}s" -t 1 -p 256 "$@" -o "$WORK/$name.json" "$addr" \
        >"$WORK/$name.txt" 2>&1
    after=$(sluice_cpu)
    grep -E "Throughput|Mean resp|^ *(50|99|99\.9) " "$WORK/$name.txt" | head -8 || true
    if [ "$pid" = "$SLUICE_PID" ]; then
        read -r s0 f0 o0 <<<"$before"
        read -r s1 f1 o1 <<<"$after"
        echo "   sluice CPU s: shards $(((s1 - s0) / 100)), fjall workers $(((f1 - f0) / 100)), other $(((o1 - o0) / 100))"
        local store
        for store in "$WORK"/sluice-data/db/store-*; do
            echo "   $(basename "$store"): $(find "$store"/keyspaces/*/tables -type f 2>/dev/null | wc -l) disk table files, $(du -sm "$store" | cut -f1) MB"
        done
    fi
}

for server in $SERVERS; do
    if [ $server = sluice ]; then pid=$SLUICE_PID addr=127.0.0.1:$SLUICE_PORT; else pid=$CASSANDRA_PID addr=127.0.0.1:$CQL_PORT; fi
    other=$([ "$pid" = "$SLUICE_PID" ] && echo "$CASSANDRA_PID" || echo "$SLUICE_PID")
    [ -n "$other" ] && kill -STOP "$other"
    kill -CONT "$pid"
    latte schema "$WORKLOADS/read.rn" "$addr" >"$WORK/$server-schema.txt" 2>&1
    latte load "$WORKLOADS/read.rn" "$addr" >"$WORK/$server-load.txt" 2>&1
done
for server in $SERVERS; do
    if [ $server = sluice ]; then pid=$SLUICE_PID addr=127.0.0.1:$SLUICE_PORT; else pid=$CASSANDRA_PID addr=127.0.0.1:$CQL_PORT; fi
    step "$server-reads-before" "$pid" "$addr" read.rn "$READ_SECS"
done
for server in $SERVERS; do
    if [ $server = sluice ]; then pid=$SLUICE_PID addr=127.0.0.1:$SLUICE_PORT; else pid=$CASSANDRA_PID addr=127.0.0.1:$CQL_PORT; fi
    step "$server-writes" "$pid" "$addr" write.rn "$WRITE_SECS" ${WRITE_RATE:+-r "$WRITE_RATE"}
    step "$server-reads-after" "$pid" "$addr" read.rn "$READ_SECS"
done
