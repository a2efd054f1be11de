# syntax=docker/dockerfile:1.7
#
# The platform-operator image: the controller and webhook binaries, and what an install needs at
# run time: Node.js and npm, the Pulumi CLI with its Node.js language host, Helm, and the
# vCluster chart 0.37.3, each download checked by sha256. Build it from the repository root:
#
#   docker build \
#     --build-arg HELM_SHA256=<sha256 of helm-v3.22.0-linux-amd64.tar.gz> \
#     --build-arg PULUMI_SHA256=<sha256 of pulumi-v3.274.1-linux-x64.tar.gz> \
#     --build-arg VCLUSTER_CHART_SHA256=<sha256 of vcluster-0.37.3.tgz> \
#     -t ghcr.io/di-framework/platform-operator:6.0.22 .
#
# The digests are build arguments without defaults: the build fails rather than trust an
# unchecked download. The build also renders the downloaded vCluster chart with the controller's
# own values and fails if the chart refuses them. The image runs as uid 1000 with a read-only root filesystem; it writes only
# to HOME (/home/platform-operator), /tmp and the state volume (npm's cache, Pulumi's plugins), which
# the chart mounts as two emptyDirs and a claim. e2e/tests/image.rs checks that the paths and
# environment set here are the binaries' flag defaults and what the chart mounts.

ARG RUST_VERSION=1.95
ARG NODE_VERSION=22

# --- the two binaries -------------------------------------------------------------------------
FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY common common
COPY controller controller
COPY webhook webhook
# A workspace member: cargo needs its manifest to resolve the workspace, not its tests' tools.
COPY e2e e2e
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p webhook -p controller \
 && install -D -m 0755 target/release/controller /out/controller \
 && install -D -m 0755 target/release/webhook /out/webhook

# --- Helm, the Pulumi CLI and the vCluster chart, each checked by sha256 ---------------------
FROM debian:bookworm-slim AS tools
ARG TARGETARCH=amd64
ARG HELM_VERSION=3.22.0
ARG HELM_SHA256
ARG PULUMI_VERSION=3.274.1
ARG PULUMI_SHA256
ARG VCLUSTER_CHART_VERSION=0.37.3
ARG VCLUSTER_CHART_SHA256
SHELL ["/bin/bash", "-euo", "pipefail", "-c"]
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /work
RUN for arg in HELM_SHA256 PULUMI_SHA256 VCLUSTER_CHART_SHA256; do \
      [[ -n ${!arg:-} ]] || { echo "set --build-arg $arg (hex sha256 of the download)" >&2; exit 1; }; \
    done
RUN case "$TARGETARCH" in \
      amd64) helm_arch=amd64; pulumi_arch=x64 ;; \
      arm64) helm_arch=arm64; pulumi_arch=arm64 ;; \
      *) echo "unsupported architecture $TARGETARCH" >&2; exit 1 ;; \
    esac \
 && curl -fsSLo helm.tgz "https://get.helm.sh/helm-v${HELM_VERSION}-linux-${helm_arch}.tar.gz" \
 && echo "${HELM_SHA256}  helm.tgz" | sha256sum -c - \
 && tar -xzf helm.tgz \
 && install -D -m 0755 "linux-${helm_arch}/helm" /out/bin/helm \
 && curl -fsSLo pulumi.tgz "https://get.pulumi.com/releases/sdk/pulumi-v${PULUMI_VERSION}-linux-${pulumi_arch}.tar.gz" \
 && echo "${PULUMI_SHA256}  pulumi.tgz" | sha256sum -c - \
 && tar -xzf pulumi.tgz \
 && install -m 0755 pulumi/pulumi pulumi/pulumi-language-nodejs pulumi/pulumi-resource-pulumi-nodejs /out/bin/ \
 && curl -fsSLo vcluster.tgz "https://charts.loft.sh/charts/vcluster-${VCLUSTER_CHART_VERSION}.tgz" \
 && echo "${VCLUSTER_CHART_SHA256}  vcluster.tgz" | sha256sum -c - \
 && install -D -m 0444 vcluster.tgz /out/vcluster.tgz
# The real chart takes the controller's values: render it with exactly the values the controller
# installs for a sample instance (--print-vcluster-values) and fail the build if its schema
# refuses them, or if it renders the control plane as anything but the Deployment vcluster the
# controller waits for. e2e/tests/image.rs runs this same command against the stand-in chart.
COPY --from=build /out/controller /work/controller
RUN controller=/work/controller helm=/out/bin/helm chart=/out/vcluster.tgz \
 && "$controller" --print-vcluster-values team-a/one > values.yaml \
 && "$helm" template vcluster "$chart" -n pi-team-a-one --kube-version 1.35.0 --values values.yaml > rendered.yaml \
 && awk -v RS='\n---' '/\nkind: Deployment\n/ && /\n  name: vcluster\n/ { d = 1 } /\nkind: StatefulSet\n/ && /\n  name: vcluster\n/ { s = 1 } END { exit !(d && !s) }' rendered.yaml \
 || { echo "the vCluster chart refused the controller's values or rendered no Deployment vcluster (see above)" >&2; exit 1; }

# --- the runtime: Node.js and npm from the base image ----------------------------------------
FROM node:${NODE_VERSION}-bookworm-slim
ARG VCLUSTER_CHART_SHA256
LABEL org.opencontainers.image.title="platform-operator" \
      org.opencontainers.image.source="https://github.com/di-framework/platform" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/controller /usr/local/bin/controller
COPY --from=build /out/webhook /usr/local/bin/webhook
# --helm-binary, --pulumi-binary and --npm-binary default to helm, pulumi and npm on PATH; the
# Pulumi CLI finds its language host and dynamic-provider plugin beside it.
COPY --from=tools /out/bin/ /usr/local/bin/
# --vcluster-chart's default; the controller checks it against VCLUSTER_CHART_SHA256 at start.
COPY --from=tools /out/vcluster.tgz /opt/platform-operator/charts/vcluster-0.37.3.tgz
# The system CA store: Helm and the Pulumi CLI (Go programs) verify TLS with it when they fetch
# plugins and charts; the slim Node.js base image leaves it empty.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
# Mount points (the chart mounts the state claim, the passphrase Secret and two emptyDirs) and a
# HOME that works without the chart too.
RUN mkdir -p /home/platform-operator /var/lib/platform-operator/state /etc/platform-operator/passphrase \
 && chown 1000:1000 /home/platform-operator /var/lib/platform-operator/state
ENV PATH=/usr/local/bin:/usr/bin:/bin \
    HOME=/home/platform-operator \
    TMPDIR=/tmp \
    VCLUSTER_CHART_SHA256=sha256:${VCLUSTER_CHART_SHA256} \
    NPM_CONFIG_UPDATE_NOTIFIER=false \
    NPM_CONFIG_FUND=false \
    PULUMI_SKIP_UPDATE_CHECK=true
USER 1000:1000
WORKDIR /home/platform-operator
ENTRYPOINT ["/usr/local/bin/controller"]
