"use strict";
// STAND-IN dynamic providers: real Kubernetes objects through the API server's REST interface.
//
// Pulumi serializes each provider object (with every function and constant it reaches) into the
// state and runs it in `pulumi-resource-pulumi-nodejs`. So everything below may use only node's
// built-in modules and what this file defines; it must not require other files of this package.
//
// Two providers:
//   - objectProvider(behaviour): one Kubernetes object, applied with server-side apply.
//   - tokenProvider(): a ServiceAccount token issued with the TokenRequest API.
// Both read the live object in `read` (so `pulumi refresh`, `preview --refresh` and
// `up --refresh` see objects deleted or changed behind Pulumi's back) and in `diff` (so a plain
// `pulumi preview --expect-no-changes` sees them too, and `pulumi up` repairs them).

const http = require("http");
const https = require("https");
const crypto = require("crypto");

/** The field manager of every write. */
const FIELD_MANAGER = "di-platform-standin";

/** The value Pulumi puts in place of an input that is not known yet (during a preview). */
const UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9";

/** Kinds this stand-in writes: API path prefix, resource name, and whether namespaced. */
const KINDS = {
  "v1/Namespace": { prefix: "/api/v1", plural: "namespaces", namespaced: false },
  "v1/ConfigMap": { prefix: "/api/v1", plural: "configmaps", namespaced: true },
  "v1/Secret": { prefix: "/api/v1", plural: "secrets", namespaced: true },
  "v1/ServiceAccount": { prefix: "/api/v1", plural: "serviceaccounts", namespaced: true },
  "rbac.authorization.k8s.io/v1/Role": {
    prefix: "/apis/rbac.authorization.k8s.io/v1",
    plural: "roles",
    namespaced: true,
  },
  "rbac.authorization.k8s.io/v1/RoleBinding": {
    prefix: "/apis/rbac.authorization.k8s.io/v1",
    plural: "rolebindings",
    namespaced: true,
  },
};

/** Tokens are re-issued by a diff once less than this many seconds of their life are left. */
const RENEW_BEFORE_SECONDS = 30 * 24 * 3600;

/** One request to the API server of `cluster`; resolves to {status, body} (body parsed JSON or text). */
function kubeRequest(cluster, method, path, body, contentType) {
  return new Promise((resolve, reject) => {
    let base;
    try {
      base = new URL(cluster.server);
    } catch (e) {
      reject(new Error(`stand-in: the kubeconfig's server ${JSON.stringify(cluster.server)} is not a URL`));
      return;
    }
    const secure = base.protocol === "https:";
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const headers = { Accept: "application/json", "User-Agent": "di-platform-standin" };
    if (payload) {
      headers["Content-Type"] = contentType || "application/json";
      headers["Content-Length"] = String(payload.length);
    }
    if (cluster.token) {
      headers.Authorization = `Bearer ${cluster.token}`;
    }
    const options = {
      method,
      hostname: base.hostname.replace(/^\[(.*)\]$/, "$1"),
      port: base.port || (secure ? 443 : 80),
      path: base.pathname.replace(/\/+$/, "") + path,
      headers,
      timeout: 30000,
    };
    if (secure) {
      if (cluster.ca) options.ca = cluster.ca;
      if (cluster.cert) options.cert = cluster.cert;
      if (cluster.key) options.key = cluster.key;
      if (cluster.tlsServerName) options.servername = cluster.tlsServerName;
      options.rejectUnauthorized = !cluster.insecure;
    }
    const req = (secure ? https : http).request(options, (res) => {
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8");
        let parsed = text;
        try {
          parsed = text ? JSON.parse(text) : undefined;
        } catch (e) {
          // keep the text
        }
        resolve({ status: res.statusCode, body: parsed });
      });
      res.on("error", reject);
    });
    req.on("timeout", () => req.destroy(new Error(`stand-in: ${method} ${path} timed out after 30 s`)));
    req.on("error", (e) =>
      reject(new Error(`stand-in: ${method} ${cluster.server}${path} failed: ${e.message}`)),
    );
    if (payload) req.write(payload);
    req.end();
  });
}

/** The error for a failed API call, with the API server's own message. */
function apiError(what, res) {
  const message = res.body && res.body.message ? res.body.message : JSON.stringify(res.body);
  return new Error(`stand-in: ${what}: HTTP ${res.status}: ${message}`);
}

/** The REST path of the object `manifest` describes (without a name when `withName` is false). */
function objectPath(manifest, withName) {
  const key = `${manifest.apiVersion}/${manifest.kind}`;
  const kind = KINDS[key];
  if (!kind) throw new Error(`stand-in: cannot manage ${key}`);
  const meta = manifest.metadata || {};
  let path = kind.prefix;
  if (kind.namespaced) path += `/namespaces/${encodeURIComponent(meta.namespace)}`;
  path += `/${kind.plural}`;
  if (withName !== false) path += `/${encodeURIComponent(meta.name)}`;
  return path;
}

/** A readable name of the object, `Kind namespace/name`. */
function describe(manifest) {
  const meta = manifest.metadata || {};
  return `${manifest.kind} ${meta.namespace ? `${meta.namespace}/` : ""}${meta.name}`;
}

/** Whether `value` holds a value Pulumi does not know yet. */
function hasUnknown(value) {
  if (value === UNKNOWN) return true;
  if (Array.isArray(value)) return value.some(hasUnknown);
  if (value && typeof value === "object") return Object.values(value).some(hasUnknown);
  return false;
}

/** Structural equality of JSON values. */
function same(a, b) {
  if (a === b) return true;
  if (Array.isArray(a) || Array.isArray(b)) {
    if (!Array.isArray(a) || !Array.isArray(b) || a.length !== b.length) return false;
    return a.every((x, i) => same(x, b[i]));
  }
  if (a && b && typeof a === "object" && typeof b === "object") {
    const ka = Object.keys(a).filter((k) => a[k] !== undefined);
    const kb = Object.keys(b).filter((k) => b[k] !== undefined);
    return ka.length === kb.length && ka.every((k) => same(a[k], b[k]));
  }
  return false;
}

/** The part of `live` that `desired` sets: objects key by key, arrays and scalars whole. */
function project(desired, live) {
  if (desired && typeof desired === "object" && !Array.isArray(desired)) {
    const out = {};
    for (const k of Object.keys(desired)) {
      const v = live && typeof live === "object" ? live[k] : undefined;
      if (v !== undefined) out[k] = project(desired[k], v);
    }
    return out;
  }
  return live;
}

/** The live object, or undefined when it is absent or being deleted. */
async function getLive(cluster, manifest) {
  const res = await kubeRequest(cluster, "GET", objectPath(manifest));
  if (res.status === 404) return undefined;
  if (res.status !== 200) throw apiError(`reading ${describe(manifest)}`, res);
  if (res.body.metadata && res.body.metadata.deletionTimestamp) return undefined;
  return res.body;
}

/** Server-side apply of `manifest`; resolves to the live object. */
async function applyObject(cluster, manifest) {
  const query = `?fieldManager=${FIELD_MANAGER}&force=true`;
  const res = await kubeRequest(
    cluster,
    "PATCH",
    objectPath(manifest) + query,
    manifest,
    "application/apply-patch+yaml",
  );
  if (res.status !== 200 && res.status !== 201) throw apiError(`applying ${describe(manifest)}`, res);
  return res.body;
}

/** The outputs of an object resource. */
function objectOuts(inputs, live) {
  return {
    cluster: inputs.cluster,
    manifest: inputs.manifest,
    uid: live.metadata.uid,
  };
}

/** The id of an object resource: `apiVersion/Kind/namespace/name`. */
function objectId(manifest) {
  const meta = manifest.metadata || {};
  return `${manifest.apiVersion}/${manifest.kind}/${meta.namespace || ""}/${meta.name}`;
}

/** The version's behaviour applied to the create or update of the settings ConfigMap. */
function misbehave(behaviour, manifest, action) {
  const meta = manifest.metadata || {};
  if (manifest.kind !== "ConfigMap" || meta.name !== "platform-settings") return undefined;
  const version = manifest.data && manifest.data.packageVersion;
  if (behaviour === "fail") {
    throw new Error(
      `stand-in @di-framework/platform ${version} is published to fail: ${action} of ` +
        `${describe(manifest)} refused on purpose (behaviour "fail")`,
    );
  }
  if (behaviour === "hang") {
    // Never settles: the operator's timeout must end the run.
    return new Promise(() => {});
  }
  return undefined;
}

/** A dynamic provider for one Kubernetes object; `behaviour` is "good", "fail" or "hang". */
function objectProvider(behaviour) {
  return {
    async check(olds, news) {
      const failures = [];
      const m = news.manifest;
      if (!m || typeof m !== "object") failures.push({ property: "manifest", reason: "missing" });
      else if (!hasUnknown(m) && !KINDS[`${m.apiVersion}/${m.kind}`]) {
        failures.push({ property: "manifest", reason: `cannot manage ${m.apiVersion}/${m.kind}` });
      }
      return { inputs: news, failures };
    },

    async create(inputs) {
      const pending = misbehave(behaviour, inputs.manifest, "create");
      if (pending) await pending;
      const live = await applyObject(inputs.cluster, inputs.manifest);
      return { id: objectId(inputs.manifest), outs: objectOuts(inputs, live) };
    },

    async read(id, props) {
      const live = await getLive(props.cluster, props.manifest);
      if (!live) return { id: "" };
      const manifest = project(props.manifest, live);
      return { id, props: { ...props, manifest, uid: live.metadata.uid } };
    },

    async diff(id, olds, news) {
      if (hasUnknown(news)) return { changes: true };
      if (objectId(olds.manifest) !== objectId(news.manifest)) {
        return { changes: true, replaces: ["manifest"], deleteBeforeReplace: false };
      }
      if (!same(olds.manifest, news.manifest) || !same(olds.cluster, news.cluster)) {
        return { changes: true };
      }
      // Nothing changed in the program: compare with the live object.
      const live = await getLive(news.cluster, news.manifest);
      if (!live || !same(project(news.manifest, live), news.manifest)) return { changes: true };
      return { changes: false };
    },

    async update(id, olds, news) {
      const pending = misbehave(behaviour, news.manifest, "update");
      if (pending) await pending;
      const live = await applyObject(news.cluster, news.manifest);
      return { outs: objectOuts(news, live) };
    },

    async delete(id, props) {
      const res = await kubeRequest(props.cluster, "DELETE", objectPath(props.manifest));
      // Namespaces finish deleting in the background; nothing waits for that.
      if (res.status !== 200 && res.status !== 202 && res.status !== 404) {
        throw apiError(`deleting ${describe(props.manifest)}`, res);
      }
    },
  };
}

/** The live ServiceAccount, or undefined when it is absent or being deleted. */
async function getServiceAccount(cluster, namespace, name) {
  return getLive(cluster, {
    apiVersion: "v1",
    kind: "ServiceAccount",
    metadata: { namespace, name },
  });
}

/** Whether a token of these outputs is still good: its account unchanged, far from expiring. */
async function tokenIsGood(props) {
  const account = await getServiceAccount(props.cluster, props.namespace, props.serviceAccount);
  if (!account || account.metadata.uid !== props.serviceAccountUid) return false;
  const expires = Date.parse(props.expirationTimestamp || "");
  return Number.isFinite(expires) && expires - Date.now() > RENEW_BEFORE_SECONDS * 1000;
}

/** A dynamic provider for a ServiceAccount token issued with the TokenRequest API. */
function tokenProvider() {
  return {
    async create(inputs) {
      const path =
        `/api/v1/namespaces/${encodeURIComponent(inputs.namespace)}` +
        `/serviceaccounts/${encodeURIComponent(inputs.serviceAccount)}/token`;
      const body = {
        apiVersion: "authentication.k8s.io/v1",
        kind: "TokenRequest",
        spec: { expirationSeconds: inputs.expirationSeconds },
      };
      const res = await kubeRequest(inputs.cluster, "POST", path, body);
      if (res.status !== 201 && res.status !== 200) {
        throw apiError(`requesting a token for ServiceAccount ${inputs.namespace}/${inputs.serviceAccount}`, res);
      }
      return {
        id: `${inputs.namespace}/${inputs.serviceAccount}/${crypto.randomUUID()}`,
        outs: {
          ...inputs,
          token: res.body.status.token,
          expirationTimestamp: res.body.status.expirationTimestamp,
        },
      };
    },

    async read(id, props) {
      return (await tokenIsGood(props)) ? { id, props } : { id: "" };
    },

    async diff(id, olds, news) {
      if (hasUnknown(news)) return { changes: true, replaces: ["serviceAccountUid"] };
      const replaces = ["namespace", "serviceAccount", "serviceAccountUid", "expirationSeconds"].filter(
        (k) => !same(olds[k], news[k]),
      );
      if (replaces.length > 0) return { changes: true, replaces, deleteBeforeReplace: false };
      if (!same(olds.cluster, news.cluster)) return { changes: true };
      if (!(await tokenIsGood({ ...olds, cluster: news.cluster }))) {
        return { changes: true, replaces: ["serviceAccountUid"], deleteBeforeReplace: false };
      }
      return { changes: false };
    },

    async update(id, olds, news) {
      // Only the connection changed: keep the token.
      return {
        outs: { ...news, token: olds.token, expirationTimestamp: olds.expirationTimestamp },
      };
    },

    async delete() {
      // A TokenRequest token cannot be revoked on its own; it ends with its ServiceAccount.
    },
  };
}

module.exports = { objectProvider, tokenProvider, kubeRequest, UNKNOWN };
