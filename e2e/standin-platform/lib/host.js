"use strict";
// STAND-IN behaviour "host" (program side only): a program that tries to reach the cluster the
// operator runs in, the ways a Kubernetes client library finds one by itself. It looks for the
// in-cluster environment (KUBERNETES_SERVICE_HOST and the ServiceAccount token), for KUBECONFIG
// and for ~/.kube/config, and writes a ConfigMap `standin-reached-the-host` (namespace
// `default`) into whatever cluster it finds; then it registers a `kubernetes` resource with no
// provider, which only the default provider (ambient credentials) could serve. The operator
// must leave it nothing to find and refuse the default provider: the test then sees the
// engine's "Default provider for 'kubernetes' disabled" error and no ConfigMap in the host.

const fs = require("fs");
const os = require("os");
const path = require("path");
const pulumi = require("@pulumi/pulumi");
const { connection } = require("./kubeconfig");
const { kubeRequest } = require("./provider");

const TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/** The cluster connections the program's environment gives away, with where each came from. */
function ambientClusters() {
  const found = [];
  const env = process.env;
  if (env.KUBERNETES_SERVICE_HOST && env.KUBERNETES_SERVICE_PORT) {
    let token;
    try {
      token = fs.readFileSync(TOKEN_PATH, "utf8").trim();
    } catch (e) {
      token = undefined;
    }
    found.push({
      from: "in-cluster environment",
      cluster: { server: `https://${env.KUBERNETES_SERVICE_HOST}:${env.KUBERNETES_SERVICE_PORT}`, token, insecure: true },
    });
  }
  const files = [];
  if (env.KUBECONFIG) files.push(...env.KUBECONFIG.split(":").filter(Boolean));
  files.push(path.join(env.HOME || os.homedir(), ".kube", "config"));
  for (const file of files) {
    try {
      found.push({ from: file, cluster: connection(fs.readFileSync(file, "utf8")) });
    } catch (e) {
      // absent or unreadable: nothing found there
    }
  }
  return found;
}

/**
 * What of the operator's files the program can reach from its project folder (the working
 * directory Pulumi runs it in, `<state>/<namespace>/<name>/platform`): the instance's install
 * record beside it, the operator's passphrase (the chart's path, and the tests' beside the state
 * folder), the other instances of its namespace, and a write into the shared dependency trees.
 * Each entry says what happened: `read`, `listed [...]`, `wrote` or the error's code.
 */
function probeFiles() {
  const attempt = (what, action) => {
    try {
      return `${what}: ${action()}`;
    } catch (e) {
      return `${what}: ${e.code || e.message}`;
    }
  };
  const own = path.basename(path.dirname(process.cwd()));
  return [
    attempt("install record", () => (fs.readFileSync("../install.json"), "read")),
    attempt("operator passphrase", () => (fs.readFileSync("/etc/platform-operator/passphrase/passphrase"), "read")),
    attempt("test passphrase", () => (fs.readFileSync("../../../../passphrase"), "read")),
    attempt("other instances", () => {
      const others = fs.readdirSync("../..").filter((n) => n !== own);
      if (others.length === 0) throw Object.assign(new Error("none"), { code: "NONE" });
      return `listed [${others.join(", ")}]`;
    }),
    attempt("shared trees", () => {
      const file = "../../../.cache/modules/standin-wrote-here";
      fs.writeFileSync(file, "x");
      fs.unlinkSync(file);
      return "wrote";
    }),
  ].join("; ");
}

/** What the "host" behaviour does instead of deploying; returns the outputs it reports. */
function probeHost() {
  const clusters = ambientClusters();
  const reached = Promise.all(
    clusters.map(async ({ from, cluster }) => {
      const body = {
        apiVersion: "v1",
        kind: "ConfigMap",
        metadata: { name: "standin-reached-the-host", namespace: "default" },
        data: { from },
      };
      try {
        const res = await kubeRequest(cluster, "POST", "/api/v1/namespaces/default/configmaps", body);
        return `${from}: HTTP ${res.status}`;
      } catch (e) {
        return `${from}: ${e.message}`;
      }
    }),
  );
  // What the probe found is logged before the resource below is registered: the SDK sends a
  // registration only once its inputs have resolved, and this input resolves after the log.
  const files = `stand-in file probe: ${probeFiles()}`;
  const report = pulumi.output(reached).apply((results) => {
    const text =
      results.length === 0
        ? "stand-in host probe: the program's environment names no cluster"
        : `stand-in host probe: tried ${results.join("; ")}`;
    return pulumi.log.info(files).then(() => pulumi.log.info(text)).then(() => text);
  });
  // A kubernetes resource with no explicit provider: only the default provider could serve it.
  new pulumi.CustomResource("kubernetes:core/v1:ConfigMap", "standin-reached-the-host", {
    apiVersion: "v1",
    kind: "ConfigMap",
    metadata: { name: "standin-reached-the-host", namespace: "default", annotations: { probe: report } },
  });
  return { httpEndpoint: undefined, routeUrlPattern: undefined, kubeconfigs: [] };
}

module.exports = { probeHost, ambientClusters, probeFiles };
