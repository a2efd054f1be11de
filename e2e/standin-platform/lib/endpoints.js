"use strict";
// STAND-IN: the HTTP endpoint outputs (program side only).

/** The HTTP endpoint reported when the settings give none. */
const DEFAULT_HTTP_ENDPOINT = "http://127.0.0.1:28080";

/** Host names that mean this machine: routes under them use `localhost`, which resolves `*.localhost`. */
function isLoopback(hostname) {
  const h = hostname.toLowerCase();
  return h === "localhost" || h.endsWith(".localhost") || h === "[::1]" || /^127(\.\d{1,3}){3}$/.test(h);
}

/**
 * The route URL template derived from a loopback `httpEndpoint` (127.0.0.0/8, ::1, localhost):
 * `<scheme>://{route}.{tenant}.localhost[:<port>]/`, where `:<port>` is present when the
 * endpoint names a port (a URL's default port, 80 or 443, is not named). The endpoint's path is
 * not used. A non-loopback endpoint gives none (undefined): as seed 003 says, the pattern can be
 * derived only from a loopback endpoint, and must be given otherwise.
 */
function routeUrlPattern(httpEndpoint) {
  let url;
  try {
    url = new URL(httpEndpoint);
  } catch (e) {
    throw new Error(`stand-in: httpEndpoint ${JSON.stringify(httpEndpoint)} is not a URL`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new Error(`stand-in: httpEndpoint ${JSON.stringify(httpEndpoint)} must be an http:// or https:// URL`);
  }
  if (!isLoopback(url.hostname)) return undefined;
  const host = "localhost";
  const port = url.port ? `:${url.port}` : "";
  return `${url.protocol}//{route}.{tenant}.${host}${port}/`;
}

module.exports = { DEFAULT_HTTP_ENDPOINT, routeUrlPattern };
