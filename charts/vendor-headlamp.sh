#!/usr/bin/env bash
# Vendors the upstream Headlamp chart into the platform-operator chart, as a release does before
# `helm package`: the archive goes into charts/platform-operator/charts/ and Chart.yaml gains the
# dependency entry with `condition: headlamp.enabled`, so Headlamp installs only when turned on.
#
#   charts/vendor-headlamp.sh [ARCHIVE] [CHART_DIR]
#
# ARCHIVE: a headlamp-0.46.0.tgz already downloaded; without it, `helm pull` fetches it from the
# upstream repository (network needed). CHART_DIR: the chart to change (default: the
# platform-operator chart next to this script). Set HEADLAMP_CHART_SHA256 (hex) to check the
# archive's digest, and HELM to the helm executable (default: helm on PATH).
set -euo pipefail

VERSION=0.46.0
REPO=https://kubernetes-sigs.github.io/headlamp/
HELM=${HELM:-helm}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
archive=${1:-}
chart=${2:-$here/platform-operator}

if [[ -z $archive ]]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  "$HELM" pull headlamp --repo "$REPO" --version "$VERSION" -d "$work"
  archive=$work/headlamp-$VERSION.tgz
fi
[[ -f $archive ]] || { echo "vendor-headlamp: $archive is not a file" >&2; exit 1; }

if [[ -n ${HEADLAMP_CHART_SHA256:-} ]]; then
  echo "${HEADLAMP_CHART_SHA256}  $archive" | sha256sum -c --quiet - \
    || { echo "vendor-headlamp: $archive does not have sha256 $HEADLAMP_CHART_SHA256" >&2; exit 1; }
fi

meta=$("$HELM" show chart "$archive")
name=$(sed -n 's/^name: *//p' <<<"$meta")
version=$(sed -n 's/^version: *//p' <<<"$meta")
if [[ $name != headlamp || $version != "$VERSION" ]]; then
  echo "vendor-headlamp: $archive is $name $version, not headlamp $VERSION" >&2
  exit 1
fi

mkdir -p "$chart/charts"
cp "$archive" "$chart/charts/headlamp-$VERSION.tgz"
if ! grep -q '^  - name: headlamp$' "$chart/Chart.yaml"; then
  cat >>"$chart/Chart.yaml" <<EOF
  # Vendored by charts/vendor-headlamp.sh from $REPO
  - name: headlamp
    version: $VERSION
    condition: headlamp.enabled
EOF
fi
echo "vendored headlamp $VERSION into $chart"
