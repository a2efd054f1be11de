#!/usr/bin/env bash
# Brings up the local control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, KWOK), installs the PlatformInstance CRD and the example instance, and runs
# until Ctrl-C. The first run builds the control plane from pinned Go modules.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash e2e/tools/build.sh >/dev/null
cargo build --locked --quiet -p controller -p webhook
exec cargo run --locked --quiet -p e2e --bin local-cluster -- up "$@"
