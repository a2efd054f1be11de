#!/usr/bin/env bash
# Installs verdaccio, the local npm registry of the end-to-end tests, from the npm registry at the
# exact versions of package-lock.json beside this script, into the cache outside the clone:
# `$cache/tools/verdaccio-<key>`, keyed by a hash of package.json, package-lock.json and the Node.js
# version, so a warm run installs nothing. `$cache/bin/verdaccio` links to the current install.
#
#   e2e/tools/verdaccio/install.sh     install when missing, print the verdaccio path
#   PLATFORM_OPERATOR_CACHE=...        cache root (default: ${XDG_CACHE_HOME:-~/.cache}/platform-operator)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${PLATFORM_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/platform-operator}"
mkdir -p "$cache/tools" "$cache/bin"

key="$(cat "$here/package.json" "$here/package-lock.json" <(node --version) | sha256sum | cut -c1-12)"
out="$cache/tools/verdaccio-$key"
if [ ! -f "$out/.complete" ]; then
  printf '[verdaccio] installing into %s\n' "$out" >&2
  # Install beside the target and rename, so that two concurrent runs cannot see half an install.
  tmp="$(mktemp -d "$cache/tools/.verdaccio-$key.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  cp "$here/package.json" "$here/package-lock.json" "$tmp/"
  # No package of the lockfile has an install script; --ignore-scripts keeps it that way.
  (cd "$tmp" && npm ci --omit=dev --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
  touch "$tmp/.complete"
  if ! mv -T "$tmp" "$out" 2>/dev/null; then
    [ -f "$out/.complete" ] || { rm -rf "$out"; mv -T "$tmp" "$out"; }
  fi
  trap - EXIT
  rm -rf "$tmp"
fi
ln -sfn "$out/node_modules/verdaccio/bin/verdaccio" "$cache/bin/verdaccio"
echo "$cache/bin/verdaccio"
