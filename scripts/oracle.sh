#!/usr/bin/env bash
# oracle.sh [SEEDS] [STATEMENTS] [FIRST_SEED] - the differential test against Cassandra 5.0 for
# longer runs: starts the reference Cassandra (scripts/anchor/cassandra, 1 GB heap, CQL port
# ORACLE_CQL_PORT, default 9142), runs tests/oracle/oracle.py over SEEDS seeds of STATEMENTS
# statements on the debug build of Sluice, and stops Cassandra again, also on failure.
# Env: ANCHOR (Cassandra's directory, default ~/.cache/sluice-anchors/oracle-cassandra),
# PYTHON (default .venv/cassandra/bin/python), KEEP_CASSANDRA=1 (leave it running).
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${1:-50}; STATEMENTS=${2:-200}; FIRST=${3:-1}
export ANCHOR=${ANCHOR:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice-anchors/oracle-cassandra}
export CQL_PORT=${ORACLE_CQL_PORT:-9142} HEAP=${HEAP:-1G}
# Storage and JMX ports away from Sluice's internode port 7000 and a default Cassandra's 7199.
export STORAGE_PORT=${STORAGE_PORT:-7100} JMX_PORT=${JMX_PORT:-7299}
PY=${PYTHON:-.venv/cassandra/bin/python}
[ -x target/debug/sluice ] || cargo build -p sluice
started=0
stop() { if [ "$started" = 1 ] && [ "${KEEP_CASSANDRA:-0}" != 1 ]; then scripts/anchor/cassandra/stop.sh; fi; }
trap stop EXIT INT TERM
started=1
FRESH=1 scripts/anchor/cassandra/start.sh
"$PY" tests/oracle/oracle.py --seed "$FIRST" --seeds "$SEEDS" --statements "$STATEMENTS" \
    --cassandra "127.0.0.1:$CQL_PORT"
