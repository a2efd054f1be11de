#!/usr/bin/env bash
# Runs every test: formatting, clippy with -D warnings, unit tests and end-to-end tests against a
# real local control plane. Builds the Go-built test binaries first (cached outside the clone).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
started="$(date +%s)"
# Minutes:seconds since the run started (or from the start to the epoch second given).
elapsed() {
  local s=$((${1:-$(date +%s)} - started))
  printf '%d:%02d' $((s / 60)) $((s % 60))
}
step() { printf '\n==> [%s] %s\n' "$(elapsed)" "$*"; }

# Downloads (Debian packages, npm packages, crates) wait on the network, not the CPU: on a cold
# machine they run in the background while the Go build below keeps both cores busy. Each writes a
# log; `await` waits for one and fails the run with its log if it failed.
bgdir="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$bgdir"' EXIT
background() {
  local name="$1"
  shift
  (
    trap 'date +%s >"$bgdir/$name.end"' EXIT
    "$@"
  ) >"$bgdir/$name.log" 2>&1 &
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
  # Chromium for the browser test; for the real nodes (e2e/src/real_node.rs, lanes 1b, 3, 4 and 5) containerd,
  # runc, the CNI plugins and iptables, and for its images (e2e/src/images.rs) buildah and
  # busybox-static; lua5.4 runs the Argo CD health check (docs/argocd-health.lua) in the
  # controller's tests.
  local extra=(lua5.4)
  [ -x /usr/bin/chromium ] || extra+=(chromium)
  bash e2e/tools/node-packages.sh "${extra[@]}"
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
  # The operator image the real nodes run (e2e/src/images.rs) carries release binaries.
  cargo build --release --locked -p controller -p webhook
  cargo clippy --workspace --all-targets --locked -- -D warnings
}
background rust rust_build
# The real vCluster's tools (e2e/tools/build.sh vcluster: vcluster from the vendored source, kine
# and CoreDNS; ~15 min cold on two cores, nothing warm) build beside the rest from the start, so
# that their cold build fills the same gaps; awaited before the timing-sensitive plugin tests.
background vcluster_tools bash e2e/tools/build.sh vcluster

step "building the test control plane from pinned Go modules (cached)"
await verdaccio
bash e2e/tools/build.sh

step "a real Prometheus server and promtool (Debian's package, unpacked into the cache), Chromium"
await debian

# Before the plugin's tests, so that their timing-sensitive component tests never share the cores
# with rustc.
step "the Rust workspace, built in the background meanwhile (test binaries, clippy)"
await rust

step "the real vCluster's tools, built in the background meanwhile (cached)"
await vcluster_tools

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

step "cargo test (unit, router and end-to-end tests), in six lanes"
# The longest end-to-end test binaries spend most of their time waiting (on npm, Pulumi, a browser,
# control planes starting), so they run beside the rest instead of after it: lane 1 the installer (its longest test in lane 1b)
# and the ownership test, lane 2 the Headlamp browser test and the stand-in platform, lane 4 the
# real node (root, Debian's containerd; its pods need the cores least when they start beside the
# rest; the node itself, then the chart with the operator image built from the Dockerfile), then
# the fleet and storage node tests (lane 3 alone, run one binary after another, was the last to
# end by six minutes in a cold run, with a core to spare), lane 5 the real vCluster on a real
# node of its own (instances through operator restarts, a recovery, a chart upgrade and deletion:
# the longest real-node test, beside lane 4 instead of after it), lane 3 every other test target
# (found in the workspace's metadata, so a new test file runs without being named here), then the
# doc tests. Each test binary starts its own control plane on free ports, so lanes do not share
# one; the tests that run Jobs (in lanes 1, 1b and 3) start a real node of their own beside it,
# each in its own network namespace, so several real nodes run at once. cargo holds its build lock
# only while it builds (everything is built above), not while tests run. Each lane's output is
# printed whole when the lane ends; the run fails if any lane failed.
lane_one=(installer ownership)
# The installer's longest test gets a lane of its own (lane 1b): run in one binary on two threads,
# it started last, after the others (libtest starts tests in name order). A rename only costs time:
# lane 1b then runs nothing and lane 1 runs every installer test.
installer_longest=installs_upgrades_fails_times_out_and_repairs_drift
lane_two=(headlamp standin_platform)
lane_four=(real_node real_node_chart fleet storage_node)
lane_five=(real_vcluster)
mapfile -t lane_three < <(
  cargo metadata --no-deps --format-version 1 --locked |
    python3 -c '
import json, sys
taken = set(sys.argv[1:])
names = sorted({t["name"] for p in json.load(sys.stdin)["packages"] for t in p["targets"]
                if "test" in t["kind"] and t["name"] not in taken})
print("\n".join(names))
' "${lane_one[@]}" "${lane_two[@]}" "${lane_four[@]}" "${lane_five[@]}"
)
test_args() { for t in "$@"; do printf -- '--test\n%s\n' "$t"; done; }
lane() {
  local name="$1"
  shift
  background "lane-$name" cargo test --workspace --locked --no-fail-fast "$@"
}
mapfile -t args_one < <(test_args "${lane_one[@]}")
mapfile -t args_two < <(test_args "${lane_two[@]}")
mapfile -t args_three < <(test_args "${lane_three[@]}")
mapfile -t args_four < <(test_args "${lane_four[@]}")
mapfile -t args_five < <(test_args "${lane_five[@]}")
lane 1 "${args_one[@]}" -- --skip "$installer_longest"
lane 1b "${args_one[@]}" -- --exact "$installer_longest"
lane 2 "${args_two[@]}"
lane 3 --lib --bins "${args_three[@]}"
lane 4 "${args_four[@]}"
lane 5 "${args_five[@]}"
failed=()
for name in 3 2 4 5 1 1b; do
  if wait "$(cat "$bgdir/lane-$name.pid")"; then status=passed; else status=FAILED; failed+=("$name"); fi
  step "lane $name ($status, ended at $(elapsed "$(cat "$bgdir/lane-$name.end")"))"
  cat "$bgdir/lane-$name.log"
done
step "cargo test --doc"
cargo test --workspace --locked --no-fail-fast --doc || failed+=(doc)
if [ "${#failed[@]}" -gt 0 ]; then
  echo "failed lanes: ${failed[*]}" >&2
  exit 1
fi
