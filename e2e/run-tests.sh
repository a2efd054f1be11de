#!/usr/bin/env bash
# Runs every test: formatting, clippy with -D warnings, unit tests and end-to-end tests against a
# real local control plane. Builds the Go-built test binaries first (cached outside the clone).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
step() { printf '\n==> %s\n' "$*"; }

# Downloads (Debian packages, npm packages, crates) wait on the network, not the CPU: on a cold
# machine they run in the background while the Go build below keeps both cores busy. Each writes a
# log; `await` waits for one and fails the run with its log if it failed.
bgdir="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$bgdir"' EXIT
background() {
  local name="$1"
  shift
  ("$@") >"$bgdir/$name.log" 2>&1 &
  echo $! >"$bgdir/$name.pid"
}
await() {
  if ! wait "$(cat "$bgdir/$1.pid")"; then
    echo "background step '$1' failed:" >&2
    cat "$bgdir/$1.log" >&2
    exit 1
  fi
}
debian_packages() {
  # One job, so two apt runs never contend for apt's lock.
  if [ ! -x /usr/bin/chromium ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  fi
  bash e2e/tools/prometheus.sh >/dev/null
}
headlamp_packages() {
  cd headlamp-plugin
  export npm_config_cache="$headlamp_npm_cache"
  local stamp
  stamp="$(sha256sum package-lock.json | cut -d' ' -f1)"
  if [ "$(cat node_modules/.ci-stamp 2>/dev/null)" != "$stamp" ]; then
    npm ci --no-audit --no-fund --prefer-offline
    echo "$stamp" >node_modules/.ci-stamp
  fi
}
headlamp_npm_cache="${npm_config_cache:-${PLATFORM_OPERATOR_CACHE:-$HOME/.cache/platform-operator}/npm}"
background debian debian_packages
background headlamp headlamp_packages
background verdaccio bash e2e/tools/verdaccio/install.sh
# The Rust workspace (the test binaries, then clippy's check) builds beside the Go tools: on a cold
# machine neither keeps both cores busy all the time (links, the last crates), so each fills the
# other's gaps. Warm, both are no-ops.
rust_build() {
  cargo fetch --locked
  cargo test --workspace --locked --no-run
  cargo clippy --workspace --all-targets --locked -- -D warnings
}
background rust rust_build

step "building the test control plane from pinned Go modules (cached)"
await verdaccio
bash e2e/tools/build.sh

step "a real Prometheus server and promtool (Debian's package, unpacked into the cache), Chromium"
await debian

# Before the plugin's tests, so that their timing-sensitive component tests never share the cores
# with rustc.
step "the Rust workspace, built in the background meanwhile (test binaries, clippy)"
await rust

step "Headlamp plugin: npm packages (cached), lint, types, unit and component tests"
# The browser test itself runs under cargo test (e2e/tests/headlamp.rs) against the real API server.
await headlamp
(
  cd headlamp-plugin
  export npm_config_cache="$headlamp_npm_cache"
  npm run lint
  npm run tsc
  CI=true npm test
)

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test (unit, router and end-to-end tests)"
cargo test --workspace --locked --no-fail-fast
