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

step "Headlamp plugin: npm packages and Chromium (cached), lint, types, unit and component tests"
# The browser test itself runs under cargo test (e2e/tests/headlamp.rs) against the real API server.
if [ ! -x /usr/bin/chromium ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
(
  cd headlamp-plugin
  export npm_config_cache="${npm_config_cache:-${PLATFORM_OPERATOR_CACHE:-$HOME/.cache/platform-operator}/npm}"
  stamp="$(sha256sum package-lock.json | cut -d' ' -f1)"
  if [ "$(cat node_modules/.ci-stamp 2>/dev/null)" != "$stamp" ]; then
    npm ci --no-audit --no-fund --prefer-offline
    echo "$stamp" > node_modules/.ci-stamp
  fi
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
