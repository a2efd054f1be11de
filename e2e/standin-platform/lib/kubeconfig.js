"use strict";
// STAND-IN: reading the admin kubeconfig and writing tenant kubeconfigs (program side only).

const fs = require("fs");
const yaml = require("js-yaml");

/** The entry `name` of a kubeconfig list (`clusters`, `users`, `contexts`). */
function entry(config, list, name) {
  const found = (config[list] || []).find((e) => e && e.name === name);
  if (!found) throw new Error(`stand-in: the kubeconfig has no ${list} entry named ${JSON.stringify(name)}`);
  return found[list.replace(/s$/, "")] || {};
}

/** The text of a `*-data` field (base64) or of the file its path-valued sibling names. */
function material(section, field) {
  if (section[`${field}-data`]) return Buffer.from(section[`${field}-data`], "base64").toString("utf8");
  if (section[field]) return fs.readFileSync(section[field], "utf8");
  return undefined;
}

/**
 * How to reach the cluster of a kubeconfig (its current context): server URL, CA, client
 * certificate and key or bearer token, TLS server name, and whether TLS checks are skipped.
 */
function connection(text) {
  const config = yaml.load(text);
  if (!config || typeof config !== "object") throw new Error("stand-in: the kubeconfig is not a YAML mapping");
  const contextName = config["current-context"] || ((config.contexts || [])[0] || {}).name;
  const context = entry(config, "contexts", contextName);
  const cluster = entry(config, "clusters", context.cluster);
  const user = entry(config, "users", context.user);
  if (!cluster.server) throw new Error("stand-in: the kubeconfig's cluster has no server");
  const out = {
    server: cluster.server,
    ca: material(cluster, "certificate-authority"),
    cert: material(user, "client-certificate"),
    key: material(user, "client-key"),
    token: user.token || (user.tokenFile ? fs.readFileSync(user.tokenFile, "utf8").trim() : undefined),
    tlsServerName: cluster["tls-server-name"],
    insecure: cluster["insecure-skip-tls-verify"] === true,
  };
  // Drop absent fields: Pulumi state keeps no `undefined`, and diffs compare what is kept.
  for (const k of Object.keys(out)) if (out[k] === undefined) delete out[k];
  return out;
}

/** A kubeconfig for `user` in `tenant`: `server` with the admin kubeconfig's CA, and `token`. */
function tenantKubeconfig({ server, admin, tenant, namespace, user, token }) {
  const name = `${user}@${tenant}`;
  const cluster = { server };
  if (admin.ca) cluster["certificate-authority-data"] = Buffer.from(admin.ca).toString("base64");
  if (admin.tlsServerName) cluster["tls-server-name"] = admin.tlsServerName;
  if (admin.insecure) cluster["insecure-skip-tls-verify"] = true;
  return yaml.dump(
    {
      apiVersion: "v1",
      kind: "Config",
      clusters: [{ name: tenant, cluster }],
      users: [{ name, user: { token } }],
      contexts: [{ name, context: { cluster: tenant, user: name, namespace } }],
      "current-context": name,
    },
    { lineWidth: -1 },
  );
}

module.exports = { connection, tenantKubeconfig };
