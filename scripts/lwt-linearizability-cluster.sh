#!/usr/bin/env bash
# The three-node LWT linearizability check (tests/go, TestLWTOnThreeNodesIsLinearizableAcrossKill9)
# for longer than the suite's 30 s: clients run for DURATION seconds with a kill -9 every 11 s
# (the group's leader and a follower in turn), RUNS times, each history checked with porcupine.
# Usage: scripts/lwt-linearizability-cluster.sh [DURATION (default 300)] [RUNS (default 1)]
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-300}
RUNS=${2:-1}
GO=$(command -v go || echo /usr/local/go/bin/go)
export SLUICE_BIN=${SLUICE_BIN:-$PWD/target/debug/sluice}
export LINZ_CLUSTER_SECONDS=$DURATION
cd tests/go
"$GO" test -count="$RUNS" -v -timeout "$((RUNS * (DURATION + 300)))s" \
    -run 'TestLWTOnThreeNodesIsLinearizableAcrossKill9$' ./...
