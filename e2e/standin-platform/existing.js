"use strict";
// STAND-IN for `@di-framework/platform/existing`: the existing-cluster entry point of the platform
// package, reduced to what the platform-operator's tests check. See README.md.

const pulumi = require("@pulumi/pulumi");
const stamp = require("./stamp.json");
const { objectProvider, tokenProvider } = require("./lib/provider");
const { connection, tenantKubeconfig } = require("./lib/kubeconfig");
const { DEFAULT_HTTP_ENDPOINT, routeUrlPattern } = require("./lib/endpoints");
const { checkSettings } = require("./lib/contract");
const { probeHost } = require("./lib/host");
const { allocateWithoutBound } = require("./lib/runaway");

/** The namespace that holds the platform's own objects. */
const PLATFORM_NAMESPACE = "di-platform";

/** How long issued tenant tokens live (one year); a diff re-issues them 30 days before the end. */
const TOKEN_SECONDS = 365 * 24 * 3600;

/** The API groups a tenant's members work with. */
const TENANT_GROUPS = ["", "apps", "batch"];

/**
 * The rules of a membership's Role in its tenant namespace: `admin` may do anything there,
 * `developer` anything with the core, apps and batch APIs, any other role only read them.
 */
function roleRules(role) {
  if (role === "admin") return [{ apiGroups: ["*"], resources: ["*"], verbs: ["*"] }];
  if (role === "developer") return [{ apiGroups: TENANT_GROUPS, resources: ["*"], verbs: ["*"] }];
  return [{ apiGroups: TENANT_GROUPS, resources: ["*"], verbs: ["get", "list", "watch"] }];
}

/** Labels on every object of the stand-in. */
const LABELS = {
  "app.kubernetes.io/managed-by": "di-platform-standin",
  "platform.di-framework.dev/stand-in": "true",
};

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

if (!["good", "fail", "hang", "host", "runaway"].includes(stamp.behaviour)) {
  throw new Error(`stand-in: unknown behaviour ${JSON.stringify(stamp.behaviour)} in stamp.json`);
}

// One provider object per kind, so Pulumi serializes each once per run.
const OBJECTS = objectProvider(stamp.behaviour);
const TOKENS = tokenProvider();

/** One Kubernetes object, created and kept as `manifest` says. */
class KubeObject extends pulumi.dynamic.Resource {
  constructor(name, args, opts) {
    const secretOutputs = ["cluster", ...((opts && opts.additionalSecretOutputs) || [])];
    super(OBJECTS, name, { ...args, uid: undefined }, { ...opts, additionalSecretOutputs: secretOutputs }, "standin", "KubeObject");
  }
}

/** A ServiceAccount token from the TokenRequest API. */
class ServiceAccountToken extends pulumi.dynamic.Resource {
  constructor(name, args, opts) {
    super(
      TOKENS,
      name,
      { ...args, token: undefined, expirationTimestamp: undefined },
      { ...opts, additionalSecretOutputs: ["cluster", "token"] },
      "standin",
      "ServiceAccountToken",
    );
  }
}

/** Throws unless every tenant and membership is well formed and names a declared tenant. */
function validate(tenants, users) {
  const names = new Set();
  for (const t of tenants) {
    if (!t || typeof t.name !== "string" || !DNS_LABEL.test(t.name) || t.name.length > 40) {
      throw new Error(`stand-in: tenant ${JSON.stringify(t)} needs a name that is a DNS label of at most 40 characters`);
    }
    if (names.has(t.name)) throw new Error(`stand-in: tenant ${t.name} is declared twice`);
    names.add(t.name);
  }
  for (const u of users) {
    if (!u || typeof u.name !== "string" || !DNS_LABEL.test(u.name)) {
      throw new Error(`stand-in: user ${JSON.stringify(u)} needs a name that is a DNS label`);
    }
    const seen = new Set();
    for (const m of u.memberships || []) {
      if (!names.has(m.tenant)) {
        throw new Error(`stand-in: user ${u.name} is a member of tenant ${m.tenant}, which is not declared in tenants`);
      }
      if (seen.has(m.tenant)) throw new Error(`stand-in: user ${u.name} has two memberships in tenant ${m.tenant}`);
      seen.add(m.tenant);
      if (typeof m.role !== "string" || !DNS_LABEL.test(m.role)) {
        throw new Error(`stand-in: user ${u.name}'s role in ${m.tenant} must be a DNS label`);
      }
    }
  }
}

/** `value` with object keys sorted, so that equal settings always give the same text. */
function sorted(value) {
  if (Array.isArray(value)) return value.map(sorted);
  if (value && typeof value === "object") {
    return Object.fromEntries(
      Object.keys(value)
        .sort()
        .filter((k) => value[k] !== undefined)
        .map((k) => [k, sorted(value[k])]),
    );
  }
  return value;
}

/**
 * Deploys the stand-in platform into the cluster of `args.kubeconfig` and returns its outputs:
 * `httpEndpoint`, `routeUrlPattern` and the secret `kubeconfigs` (one per membership).
 */
function deploy(args) {
  // Only the settings of the contract, each of its type: anything else fails here.
  checkSettings(args);
  if (stamp.behaviour === "host") return probeHost();
  if (stamp.behaviour === "runaway") allocateWithoutBound();
  const { kubeconfig, ...rest } = args;
  const tenants = rest.tenants || [];
  const users = rest.users || [];
  validate(tenants, users);

  // How the providers reach the cluster (server, CA, client credentials): a secret input.
  const cluster = pulumi.secret(pulumi.output(kubeconfig).apply(connection));

  // The applied settings without secrets: the kubeconfig is left out, the client secret too.
  const settings = { ...rest };
  let clientSecret;
  if (rest.tenantAuth) {
    const { clientSecret: secret, ...auth } = rest.tenantAuth;
    settings.tenantAuth = auth;
    clientSecret = secret;
  }
  const httpEndpoint = rest.httpEndpoint || DEFAULT_HTTP_ENDPOINT;
  // Given, or derived from a loopback endpoint; not derivable otherwise (seed 003).
  const pattern = rest.routeUrlPattern || routeUrlPattern(httpEndpoint);

  const platformNs = new KubeObject(`Namespace/${PLATFORM_NAMESPACE}`, {
    cluster,
    manifest: { apiVersion: "v1", kind: "Namespace", metadata: { name: PLATFORM_NAMESPACE, labels: LABELS } },
  });

  const settingsMap = new KubeObject(`ConfigMap/${PLATFORM_NAMESPACE}/platform-settings`, {
    cluster,
    manifest: {
      apiVersion: "v1",
      kind: "ConfigMap",
      metadata: { name: "platform-settings", namespace: PLATFORM_NAMESPACE, labels: LABELS },
      data: {
        "settings.json": JSON.stringify(sorted(settings)),
        packageVersion: stamp.version,
        httpEndpoint,
        ...(pattern ? { routeUrlPattern: pattern } : {}),
      },
    },
  }, { dependsOn: [platformNs] });

  if (rest.tenantAuth) {
    if (clientSecret === undefined) throw new Error("stand-in: tenantAuth needs clientSecret");
    new KubeObject(`Secret/${PLATFORM_NAMESPACE}/tenant-auth`, {
      cluster,
      manifest: pulumi.secret(pulumi.output(clientSecret).apply((s) => ({
        apiVersion: "v1",
        kind: "Secret",
        type: "Opaque",
        metadata: { name: "tenant-auth", namespace: PLATFORM_NAMESPACE, labels: LABELS },
        data: { clientSecret: Buffer.from(String(s)).toString("base64") },
      }))),
    }, { dependsOn: [platformNs], additionalSecretOutputs: ["manifest"] });
  }

  // Tenants come after the settings, so a failing or hanging settings step stops them too.
  const tenantNs = {};
  for (const t of tenants) {
    const name = `tenant-${t.name}`;
    tenantNs[t.name] = new KubeObject(`Namespace/${name}`, {
      cluster,
      manifest: {
        apiVersion: "v1",
        kind: "Namespace",
        metadata: { name, labels: { ...LABELS, "platform.di-framework.dev/tenant": t.name } },
      },
    }, { dependsOn: [settingsMap] });
  }

  const kubeconfigs = [];
  for (const u of users) {
    for (const m of u.memberships || []) {
      const namespace = `tenant-${m.tenant}`;
      const labels = { ...LABELS, "platform.di-framework.dev/tenant": m.tenant, "platform.di-framework.dev/user": u.name };
      const account = new KubeObject(`ServiceAccount/${namespace}/${u.name}`, {
        cluster,
        manifest: { apiVersion: "v1", kind: "ServiceAccount", metadata: { name: u.name, namespace, labels } },
      }, { dependsOn: [tenantNs[m.tenant]] });
      const roleLabels = { ...labels, "platform.di-framework.dev/role": m.role };
      const role = new KubeObject(`Role/${namespace}/member-${u.name}`, {
        cluster,
        manifest: {
          apiVersion: "rbac.authorization.k8s.io/v1",
          kind: "Role",
          metadata: { name: `member-${u.name}`, namespace, labels: roleLabels },
          rules: roleRules(m.role),
        },
      }, { dependsOn: [tenantNs[m.tenant]] });
      new KubeObject(`RoleBinding/${namespace}/member-${u.name}`, {
        cluster,
        manifest: {
          apiVersion: "rbac.authorization.k8s.io/v1",
          kind: "RoleBinding",
          metadata: { name: `member-${u.name}`, namespace, labels: roleLabels },
          roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "Role", name: `member-${u.name}` },
          subjects: [{ kind: "ServiceAccount", name: u.name, namespace }],
        },
      }, { dependsOn: [account, role] });
      const token = new ServiceAccountToken(`Token/${namespace}/${u.name}`, {
        cluster,
        namespace,
        serviceAccount: u.name,
        serviceAccountUid: account.uid,
        expirationSeconds: TOKEN_SECONDS,
      }, { dependsOn: [account] });
      const server = rest.kubernetesEndpoint ? pulumi.output(rest.kubernetesEndpoint) : cluster.apply((c) => c.server);
      kubeconfigs.push(
        pulumi.all([cluster, server, token.token]).apply(([adminConn, endpoint, jwt]) => ({
          tenant: m.tenant,
          user: u.name,
          role: m.role,
          kubeconfig: tenantKubeconfig({ server: endpoint, admin: adminConn, tenant: m.tenant, namespace, user: u.name, token: jwt }),
        })),
      );
    }
  }

  return {
    httpEndpoint,
    routeUrlPattern: pattern,
    kubeconfigs: pulumi.secret(pulumi.all(kubeconfigs)),
  };
}

module.exports = { deploy, version: stamp.version, standIn: true };
