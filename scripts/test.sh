#!/usr/bin/env bash
# Every test of the project, from a fresh Debian machine with Rust, Python 3.11 and Go 1.26:
#   venvs (idempotent) -> build -> fmt -> clippy -> cargo tests (workspace, patched lsm-tree, patched fjall) -> pytest (both drivers)
#   -> the LWT linearizability check (tests/go, Go) -> the differential test against Cassandra 5.0 (tests/oracle).
# Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

step() { printf '\n==> %s\n' "$*"; }

# Python venvs: cqlsh + cassandra-driver, and scylla-driver separately (both install the
# `cassandra` module, so they cannot share one venv).
PY=${PYTHON:-python3}
export CASS_DRIVER_NO_CYTHON=1          # pure-Python fallback if a source build is needed
export PIP_DISABLE_PIP_VERSION_CHECK=1
make_venv() {
    local dir=$1; shift
    if [ ! -x "$dir/bin/python" ] || [ ! -f "$dir/.installed" ] || [ "$(cat "$dir/.installed")" != "$*" ]; then
        step "venv $dir: $*"
        "$PY" -m venv "$dir"
        "$dir/bin/pip" install --quiet --prefer-binary "$@"
        echo "$*" > "$dir/.installed"
    fi
}
make_venv .venv/cassandra cqlsh cassandra-driver pytest
make_venv .venv/scylla scylla-driver pytest

step "cargo build (debug, binary under test)"
cargo build -p sluice

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo test"
cargo test --workspace

# The vendored lsm-tree is not a workspace member; its own unit tests cover Sluice's patches
# to it (vendor/lsm-tree/SLUICE_PATCH.md).
step "cargo test: patched lsm-tree"
cargo test --lib --manifest-path vendor/lsm-tree/Cargo.toml \
    --target-dir "${CARGO_TARGET_DIR:-$ROOT/target}/vendor-tests"

# So is the vendored fjall; its worker-pool tests cover Sluice's patch to its flush requests
# (vendor/fjall/SLUICE_PATCH.md), built against the vendored lsm-tree as the workspace is.
step "cargo test: patched fjall (worker pool)"
cargo test --lib --manifest-path vendor/fjall/Cargo.toml \
    --config "patch.crates-io.lsm-tree.path=\"$ROOT/vendor/lsm-tree\"" \
    --target-dir "${CARGO_TARGET_DIR:-$ROOT/target}/vendor-tests" worker_pool::

export SLUICE_BIN="$ROOT/target/debug/sluice"
if [ -n "${CARGO_TARGET_DIR:-}" ]; then
    export SLUICE_BIN="$CARGO_TARGET_DIR/debug/sluice"
fi

step "pytest: cqlsh + cassandra-driver"
.venv/cassandra/bin/python -m pytest -q tests/python/cassandra

step "pytest: scylla-driver"
.venv/scylla/bin/python -m pytest -q tests/python/scylla

# LWT histories recorded against the binary (one node with a kill -9 and restart; three nodes
# with a kill -9 of the leader and of a follower) and checked with the porcupine
# linearizability checker; `go test` fetches the pinned modules (tests/go/go.sum).
# -count=1: the binary under test is outside Go's test cache key.
step "go test: LWT linearizability (tests/go)"
GO=$(command -v go || echo /usr/local/go/bin/go)
(cd tests/go && "$GO" test -count=1 ./...)

# The differential test against the reference Cassandra 5.0 (tests/oracle): the anchor script
# installs Java 17 and Maven from Debian and the jars from Maven Central. A bounded run here;
# scripts/oracle.sh runs longer ones. ORACLE=0 skips it.
if [ "${ORACLE:-1}" = 1 ]; then
    step "oracle: Sluice against Cassandra 5.0 (bounded)"
    (
        export ANCHOR=${ORACLE_ANCHOR:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice-anchors/oracle-cassandra}
        export CQL_PORT=9142 HEAP=1G STORAGE_PORT=7100 JMX_PORT=7299
        trap 'scripts/anchor/cassandra/stop.sh; rm -rf "$ANCHOR/data"' EXIT
        FRESH=1 scripts/anchor/cassandra/start.sh
        ORACLE_CASSANDRA=127.0.0.1:$CQL_PORT ORACLE_SEEDS=40 ORACLE_STATEMENTS=200 \
            .venv/cassandra/bin/python -m pytest -q -p no:cacheprovider tests/oracle
    )
fi

step "all tests passed"
