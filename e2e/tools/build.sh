#!/usr/bin/env bash
# Builds the test control plane from pinned Go modules: kube-apiserver, kube-controller-manager,
# kube-scheduler and kubectl (k8s.io/kubernetes), the real node's kubelet and kube-proxy (the same
# pinned k8s.io/kubernetes and version stamping, in a cache entry of their own), etcd, helm and
# kwok (with its stage files), and the Pulumi CLI with a Node.js language host and the Node.js
# dynamic-provider plugin (see pulumi/NOTES.md).
#
# Each tool has its own wrapper module beside this script (go.mod + go.sum pin every version).
# Binaries go to a cache outside the clone, keyed by a hash of the module files and the Go
# version, so a fresh clone reuses them; `$cache/bin` holds links to the current builds.
#
#   e2e/tools/build.sh            build what is missing, print the bin folder
#   PLATFORM_OPERATOR_CACHE=...   cache root (default: ${XDG_CACHE_HOME:-~/.cache}/platform-operator)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${PLATFORM_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/platform-operator}"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
mkdir -p "$cache/tools" "$cache/bin"

log() { printf '[build-tools] %s\n' "$*" >&2; }

# key NAME: a short hash over the wrapper module (go.mod, go.sum and any sources or scripts of
# its own) and the Go version. NAME may be OUT:WRAPPER (see build): the hash then covers OUT too.
key() {
  case "$1" in
    *:*) { key "${1#*:}"; echo "${1%%:*}"; } | sha256sum | cut -c1-12; return ;;
  esac
  local dir="$here/$1"
  {
    cat "$dir/go.mod" "$dir/go.sum"
    find "$dir" -type f ! -name go.mod ! -name go.sum ! -name '*.md' -print0 | LC_ALL=C sort -z | xargs -0r cat
    go env GOVERSION
  } | sha256sum | cut -c1-12
}

# modver NAME MODULE: the version the wrapper module resolves for MODULE.
modver() { (cd "$here/$1" && go list -m -f '{{.Version}}' "$2"); }

# build NAME LDFLAGS PACKAGE...: build PACKAGEs of wrapper NAME into the cache, once. NAME
# OUT:WRAPPER builds more packages of wrapper WRAPPER into a cache entry OUT of their own, so that
# adding them does not rebuild (or change the key of) what WRAPPER already builds.
build() {
  local name="${1%%:*}" wrapper="${1#*:}" ldflags="$2"
  local out
  out="$cache/tools/$name-$(key "$1")"
  shift 2
  if [ ! -f "$out/.complete" ]; then
    log "building $name into $out (cold builds of kubernetes take several minutes)"
    rm -rf "$out"
    mkdir -p "$out/bin"
    (cd "$here/$wrapper" && go build -trimpath -ldflags "-s -w $ldflags" -o "$out/bin/" "$@")
    case "$name" in
      etcd)
        # Its main package is the module root (…/server/v3): name the binary etcd.
        for b in "$out"/bin/*; do [ "$b" = "$out/bin/etcd" ] || mv "$b" "$out/bin/etcd"; done
        ;;
      kwok)
        local dir
        dir="$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
        cp -r "$dir/kustomize/stage" "$out/stage"
        chmod -R u+w "$out/stage"
        ;;
      pulumi)
        # Bundled plugins: the CLI looks for them next to its own (symlink-resolved) binary.
        install -m 0755 "$here/pulumi/pulumi-resource-pulumi-nodejs" "$out/bin/"
        ;;
    esac
    touch "$out/.complete"
  fi
  for b in "$out"/bin/*; do ln -sfn "$b" "$cache/bin/$(basename "$b")"; done
  if [ -d "$out/stage" ]; then ln -sfn "$out/stage" "$cache/kwok-stage"; fi
}

k8s_version="$(modver kubernetes k8s.io/kubernetes)"
k8s_minor="$(echo "$k8s_version" | cut -d. -f2)"
k8s_flags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_flags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
  k8s_flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
build kubernetes "$k8s_flags" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubectl

# The real node's binaries (e2e/src/real_node.rs): the same module and stamping, built after the
# control plane so that a run needing only the control plane has it first.
build kubernetes-node:kubernetes "$k8s_flags" \
  k8s.io/kubernetes/cmd/kubelet \
  k8s.io/kubernetes/cmd/kube-proxy

build etcd "" go.etcd.io/etcd/server/v3

helm_version="$(modver helm helm.sh/helm/v3)"
build helm "-X helm.sh/helm/v3/internal/version.version=$helm_version" helm.sh/helm/v3/cmd/helm

kwok_version="$(modver kwok sigs.k8s.io/kwok)"
build kwok "-X sigs.k8s.io/kwok/pkg/consts.Version=$kwok_version" sigs.k8s.io/kwok/cmd/kwok

# The CLI from pkg/v3; the Node.js language host is a STAND-IN of our own (./cmd/pulumi-language-nodejs, see
# pulumi/NOTES.md). Cold build: ~12 min on 2 loaded cores (6-8 min idle).
pulumi_version="$(modver pulumi github.com/pulumi/pulumi/sdk/v3)"
build pulumi "-X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$pulumi_version" \
  github.com/pulumi/pulumi/pkg/v3/cmd/pulumi \
  ./cmd/pulumi-language-nodejs

# The local npm registry of the stand-in platform tests: verdaccio from the npm registry, pinned by
# verdaccio/package-lock.json (see e2e/src/npm.rs).
bash "$here/verdaccio/install.sh" >/dev/null

echo "$cache/bin"
