#!/usr/bin/env bash
# The demo: a local control plane with a real node, the operator chart installed there with the
# operator image built from the Dockerfile, the real vCluster, and the example instance, running
# until Ctrl-C (needs root). `e2e/run-demo.sh --process` runs the webhook and the controller as
# processes with the stand-in vCluster instead (no root needed); it installs no platform (the
# program runs only in install pods: its controller runs with --install-platform=false), so the
# example stops at Installing with its vCluster and kubeconfig. The first run builds the control
# plane, the real node's kubelet and the real vCluster's tools from pinned sources (cached).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash e2e/tools/build.sh >/dev/null
process=false
for arg in "$@"; do [ "$arg" = "--process" ] && process=true; done
if $process; then
  cargo build --locked --quiet -p controller -p webhook
else
  if [ "$(id -u)" != 0 ]; then
    echo "the demo runs a real node and needs root; run it as root, or run e2e/run-demo.sh --process" >&2
    exit 1
  fi
  bash e2e/tools/node-packages.sh
  echo "building the real vCluster's tools (cached; the first run takes about 15 minutes)" >&2
  bash e2e/tools/build.sh vcluster >/dev/null
  cargo build --locked --quiet --release -p controller -p webhook
fi
exec cargo run --locked --quiet -p e2e --bin local-cluster -- up "$@"
