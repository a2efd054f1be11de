#!/usr/bin/env bash
# Makes a real Prometheus server and promtool available to the monitoring tests: Debian's
# `prometheus` package (2.42 on Debian 12). Quick when they are already there. The package's
# binaries are unpacked into the tool cache (PLATFORM_OPERATOR_CACHE, default
# ~/.cache/platform-operator/prometheus) rather than installed, so no Debian service is started;
# the tests run their own `prometheus` processes on loopback.
set -euo pipefail

cache="${PLATFORM_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/platform-operator}/prometheus"
bin="$cache/usr/bin"
if [[ -x "$bin/prometheus" && -x "$bin/promtool" ]]; then
  echo "$bin"
  exit 0
fi
if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
  dirname "$(command -v promtool)"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
# apt-get download needs no root, and unpacking starts no service.
if ! apt-get download prometheus >&2; then
  echo "apt-get download failed; updating the package lists once" >&2
  if [[ "$(id -u)" == 0 ]]; then apt-get update >&2; else sudo apt-get update >&2; fi
  apt-get download prometheus >&2
fi
rm -rf "$cache"
mkdir -p "$cache"
dpkg-deb -x prometheus_*.deb "$cache"
"$bin/promtool" --version >&2
echo "$bin"
