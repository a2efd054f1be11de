#!/usr/bin/env bash
# Installs the Debian packages the real node (e2e/src/real_node.rs) and its images
# (e2e/src/images.rs) need, when missing: containerd, runc, the CNI plugins and iptables, buildah
# and busybox-static; plus any package names given as arguments. Needs root when one is missing.
set -euo pipefail
want=()
for pkg in containerd runc containernetworking-plugins iptables buildah busybox-static "$@"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || want+=("$pkg")
done
if [ "${#want[@]}" -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${want[@]}" >/dev/null
fi
