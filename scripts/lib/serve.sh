# Sourced by the benchmark scripts that run one `sluice serve` at a time on 127.0.0.1 with a
# fresh data directory per run. The caller has `set -euo pipefail` and is at the repository root.
#
# serve_setup NAME BIN...   WORK (a temporary directory removed on exit), BIN (the release
#                           directory), and builds the binaries BIN... unless NO_BUILD=1
# free_port                 prints a free TCP port on 127.0.0.1
# serve_start PORT ARG...   starts `sluice serve` on PORT with a fresh WORK/data, SHARDS shards,
#                           no shard-aware port, log level warn and ARG...; returns once it listens
# serve_stop                SIGTERM to the server and waits for it

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
BIN=$CARGO_TARGET_DIR/release
SERVER=

serve_setup() {
    local name=$1
    shift
    WORK=$(mktemp -d "/tmp/sluice-$name.XXXXXX")
    trap serve_cleanup EXIT
    local bins=()
    for bin in "$@"; do bins+=(--bin "$bin"); done
    if [ "${NO_BUILD:-0}" != 1 ] && ! cargo build --release -p sluice -p sluice-bench \
        "${bins[@]}" >"$WORK/build.log" 2>&1; then
        cat "$WORK/build.log" >&2
        exit 1
    fi
}

serve_cleanup() {
    if [ -n "$SERVER" ]; then kill -KILL "$SERVER" 2>/dev/null || true; fi
    wait 2>/dev/null || true
    rm -rf "$WORK"
}

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

serve_start() {
    local port=$1
    shift
    rm -rf "$WORK/data"
    "$BIN/sluice" serve --listen "127.0.0.1:$port" --data-dir "$WORK/data" \
        --shards "$SHARDS" --shard-aware-port off --log warn "$@" >"$WORK/server.log" 2>&1 &
    SERVER=$!
    wait_listening "$port" "$SERVER" "$WORK/server.log"
}

serve_stop() {
    kill -TERM "$SERVER"
    wait "$SERVER" 2>/dev/null || true
    SERVER=
}
