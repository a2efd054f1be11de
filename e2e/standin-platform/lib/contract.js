"use strict";
// STAND-IN: the settings `deploy()` accepts, checked before anything is created (program side
// only). The list is the platform's settings (docs/controller.md, "The platform program's
// contract"); any other key, or a value of the wrong type, fails the program with the path of
// the offending value, so a drift between the operator and the contract fails a test.

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const PULL_POLICIES = ["Always", "IfNotPresent", "Never"];
const ENGINES = ["existing", "kube-router"];

/** A string, a Pulumi Output or a promise (a secret the program passes through). */
function isSecretValue(value) {
  return (
    typeof value === "string" ||
    (value !== null && typeof value === "object" && (typeof value.apply === "function" || typeof value.then === "function"))
  );
}

function fail(path, why) {
  throw new Error(
    `stand-in: deploy() setting ${path} ${why}; the program contract is in the platform-operator's docs/controller.md`,
  );
}

function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/** Checks `value` at `path` against `spec`, a type name or a nested description. */
function check(path, value, spec) {
  if (typeof spec === "function") return spec(path, value);
  if (spec === "string") {
    if (typeof value !== "string") fail(path, `must be a string, got ${JSON.stringify(value)}`);
    return;
  }
  if (spec.object) {
    if (!isObject(value)) fail(path, `must be an object, got ${JSON.stringify(value)}`);
    for (const key of Object.keys(value)) {
      if (value[key] === undefined) continue;
      if (!(key in spec.object)) {
        fail(`${path}.${key}`, `is not a setting of the platform (known here: ${Object.keys(spec.object).join(", ")})`);
      }
      check(`${path}.${key}`, value[key], spec.object[key].type || spec.object[key]);
    }
    for (const [key, field] of Object.entries(spec.object)) {
      if (field.required && value[key] === undefined) fail(`${path}.${key}`, "is required");
    }
    return;
  }
  if (spec.array) {
    if (!Array.isArray(value)) fail(path, `must be an array, got ${JSON.stringify(value)}`);
    value.forEach((item, i) => check(`${path}[${i}]`, item, spec.array));
    return;
  }
  if (spec.oneOf) {
    if (!spec.oneOf.includes(value)) fail(path, `must be one of ${spec.oneOf.join(", ")}, got ${JSON.stringify(value)}`);
    return;
  }
  throw new Error(`stand-in: bad contract entry at ${path}`);
}

function dnsLabel(path, value) {
  if (typeof value !== "string" || !DNS_LABEL.test(value)) fail(path, `must be a DNS label, got ${JSON.stringify(value)}`);
}

function httpUrl(path, value) {
  if (typeof value !== "string") fail(path, `must be a string, got ${JSON.stringify(value)}`);
  let url;
  try {
    url = new URL(value);
  } catch (e) {
    fail(path, `must be an absolute http:// or https:// URL, got ${JSON.stringify(value)}`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    fail(path, `must be an http:// or https:// URL, got ${JSON.stringify(value)}`);
  }
}

function routePattern(path, value) {
  if (typeof value !== "string" || !/^https?:\/\/[^/?#]+/.test(value) || !value.includes("{route}") || !value.includes("{tenant}")) {
    fail(path, `must be an http(s) URL template holding {route} and {tenant}, got ${JSON.stringify(value)}`);
  }
}

function nodePort(path, value) {
  if (!Number.isInteger(value) || !(value === 0 || (value >= 30000 && value <= 32767))) {
    fail(path, `must be 0 or an integer NodePort in 30000-32767, got ${JSON.stringify(value)}`);
  }
}

function secret(path, value) {
  if (!isSecretValue(value)) fail(path, "must be a string or a Pulumi secret output");
}

/** The settings `deploy()` accepts, each with its type. */
const SETTINGS = {
  object: {
    kubeconfig: { type: secret, required: true },
    tenants: { array: { object: { name: { type: dnsLabel, required: true } } } },
    users: {
      array: {
        object: {
          name: { type: dnsLabel, required: true },
          memberships: { array: { object: { tenant: { type: dnsLabel, required: true }, role: { type: dnsLabel, required: true } } } },
        },
      },
    },
    tenantAuth: {
      object: {
        image: { type: "string", required: true },
        issuer: { type: httpUrl, required: true },
        clientId: { type: "string", required: true },
        clientSecret: { type: secret, required: true },
        registry: { object: { component: { type: "string", required: true } } },
      },
    },
    tenantHostImage: "string",
    tenantHostImagePullPolicy: { oneOf: PULL_POLICIES },
    storageRoot: "string",
    kubernetesEndpoint: httpUrl,
    httpEndpoint: httpUrl,
    routeUrlPattern: routePattern,
    egressAllowedDestinations: { array: "string" },
    networkPolicyEngine: { oneOf: ENGINES },
    gateway: { object: { httpNodePort: { type: nodePort } } },
  },
};

/** Throws unless `args` holds only settings of the contract, each of its type. */
function checkSettings(args) {
  check("args", args, SETTINGS);
}

module.exports = { checkSettings, SETTINGS };
