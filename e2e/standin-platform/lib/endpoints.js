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
 * The route URL template for `httpEndpoint`: `<scheme>://{route}.{tenant}.<host>[:<port>]/`, where
 * <host> is `localhost` for a loopback endpoint (127.0.0.0/8, ::1, localhost) and the endpoint's
 * host name otherwise, and `:<port>` is present when the endpoint names a port (a URL's default
 * port, 80 or 443, is not named). The endpoint's path is not used.
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
  const host = isLoopback(url.hostname) ? "localhost" : url.hostname;
  const port = url.port ? `:${url.port}` : "";
  return `${url.protocol}//{route}.{tenant}.${host}${port}/`;
}

module.exports = { DEFAULT_HTTP_ENDPOINT, routeUrlPattern };
