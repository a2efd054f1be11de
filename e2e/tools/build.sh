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
#   e2e/tools/build.sh vcluster   build only the real vCluster's tools (see build_vcluster below)
#   PLATFORM_OPERATOR_CACHE=...   cache root (default: ${XDG_CACHE_HOME:-~/.cache}/platform-operator)
#   PLATFORM_OPERATOR_VCLUSTER_VENDOR=...  the vendored vCluster (default: ../shared/vendor/vcluster
#                                 beside the clone)
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

# The real vCluster (e2e/tests/real_vcluster.rs; its source and chart are vendored outside the
# clone, see ../shared/vendor/vcluster/README.md), each built as a tool, never copied from:
#  - vcluster from the source archive, checked against SHA256SUMS first, with its committed vendor/
#    (no network; ~11 min and 2.5 GB cold on two cores). Unstamped, it reports version `dev`,
#    which also turns its telemetry off.
#  - kine (the syncer's sqlite backend; the distro image carries it since vCluster 0.36) from its Go
#    module, with cgo for mattn/go-sqlite3, linked statically so it runs in any image (~3 min).
#  - CoreDNS from its Go module, at the version vCluster selects for the virtual cluster's
#    Kubernetes minor (pkg/constants/coredns.go: 1.35 -> coredns/coredns:1.14.1).
# One lock: the test command starts this in the background and a test may call it too; the second
# caller waits for the first and then finds everything built.
build_vcluster() {
  local vendor="${PLATFORM_OPERATOR_VCLUSTER_VENDOR:-$here/../../../shared/vendor/vcluster}"
  local archive=vcluster-src-0.37.0-rc.1.tar.gz
  exec 9>"$cache/tools/.vcluster.lock"
  flock 9
  if [ ! -f "$vendor/$archive" ] || [ ! -f "$vendor/SHA256SUMS" ]; then
    echo "the vendored vCluster is missing: $vendor/$archive (set PLATFORM_OPERATOR_VCLUSTER_VENDOR)" >&2
    exit 1
  fi
  local sum out
  sum="$(grep " $archive\$" "$vendor/SHA256SUMS" | cut -d' ' -f1)"
  out="$cache/tools/vcluster-$({ echo "$sum"; go env GOVERSION; } | sha256sum | cut -c1-12)"
  if [ ! -f "$out/.complete" ]; then
    log "building vcluster into $out (cold: ~11 min on two cores, 2.5 GB)"
    (cd "$vendor" && grep " $archive\$" SHA256SUMS | sha256sum -c --quiet -) || {
      echo "$vendor/$archive does not match its SHA256SUMS" >&2
      exit 1
    }
    rm -rf "$out"
    mkdir -p "$out/bin" "$out/src"
    tar -xzf "$vendor/$archive" -C "$out/src" --strip-components=1
    (cd "$out/src" && CGO_ENABLED=0 go build -mod=vendor -trimpath -ldflags "-s -w" -o "$out/bin/vcluster" ./cmd/vcluster)
    rm -rf "$out/src"
    touch "$out/.complete"
  fi
  ln -sfn "$out/bin/vcluster" "$cache/bin/vcluster"
  CGO_ENABLED=1 build kine "-X github.com/k3s-io/kine/pkg/version.Version=$(modver kine github.com/k3s-io/kine) -extldflags -static" \
    -tags "netgo osusergo sqlite_omit_load_extension" github.com/k3s-io/kine
  CGO_ENABLED=0 build coredns "" github.com/coredns/coredns
  flock -u 9
}
if [ "${1:-}" = vcluster ]; then
  build_vcluster
  echo "$cache/bin"
  exit 0
fi

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
