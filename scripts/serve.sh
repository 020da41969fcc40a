#!/usr/bin/env bash
# Builds the release binary and starts a node on its embedded defaults
# (127.0.0.1:9042, ./sluice-data, one shard per core). Extra arguments go to `sluice serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p sluice
exec "${CARGO_TARGET_DIR:-target}/release/sluice" serve "$@"
