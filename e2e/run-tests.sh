#!/usr/bin/env bash
# Runs every test: formatting, clippy with -D warnings, unit tests and end-to-end tests against a
# real local control plane. Builds the Go-built test binaries first (cached outside the clone).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
step() { printf '\n==> %s\n' "$*"; }

step "building the test control plane from pinned Go modules (cached)"
bash e2e/tools/build.sh

step "a real Prometheus server and promtool (Debian's package, unpacked into the cache)"
bash e2e/tools/prometheus.sh >/dev/null

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test (unit, router and end-to-end tests)"
cargo test --workspace --locked --no-fail-fast
