// A stand-in for Headlamp's backend (its Go module cannot be had here), for the browser test.
// It does what Headlamp's backend does for the frontend and nothing more:
//   GET /config                      the clusters, one per test user (no credentials in it)
//   GET /plugins                     the plugin list; /plugins/<name>/{main.js,package.json}
//                                    served from the unpacked release tarball
//   /clusters/<cluster>/<api path>   proxied to the real API server with that cluster's user
//                                    token (HTTP and WebSocket watches); the CA is checked
//   anything else                    the frontend page (a single-page app)
// Like the real backend it adds no permission of its own: every API call runs as the user, so
// RBAC on the real API server decides; an unknown cluster is a 404; request bodies and the
// API server's answers (status codes and messages) pass through unchanged.
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import path from 'node:path';

/**
 * Starts the stand-in. `options`: apiServer (https URL), ca (PEM), clusters ({name: token}),
 * pluginDir (folder with main.js and package.json), pluginName, pageDir (the built page), port.
 * Resolves to { url, close }.
 */
export function startStandinBackend(options) {
  const { apiServer, ca, clusters, pluginDir, pluginName, pageDir } = options;
  const api = new URL(apiServer);
  const agent = new https.Agent({ ca, keepAlive: true });
  const log = [];

  const types = {
    '.html': 'text/html; charset=utf-8',
    '.js': 'text/javascript; charset=utf-8',
    '.json': 'application/json',
    '.css': 'text/css',
    '.svg': 'image/svg+xml',
    '.woff2': 'font/woff2',
    '.ttf': 'font/ttf',
  };

  function sendFile(res, file) {
    fs.readFile(file, (err, data) => {
      if (err) {
        res.writeHead(404, { 'content-type': 'text/plain' }).end('not found');
        return;
      }
      res.writeHead(200, {
        'content-type': types[path.extname(file)] ?? 'application/octet-stream',
      });
      res.end(data);
    });
  }

  /** The cluster and the API path of a /clusters/<name>/<path> URL, or null. */
  function route(url) {
    const m = url.match(/^\/clusters\/([^/]+)(\/.*)$/);
    if (!m) return null;
    const name = decodeURIComponent(m[1]);
    if (!Object.hasOwn(clusters, name)) return { unknown: name };
    return { name, token: clusters[name], apiPath: m[2] };
  }

  /**
   * Request headers for the API server: the browser's, less its cookies and credentials, plus the
   * user's token. Origin stays: the API server's WebSocket handshake refuses a request without it.
   */
  function upstreamHeaders(req, token) {
    const headers = { ...req.headers };
    for (const h of [
      'cookie',
      'authorization',
      'host',
      'referer',
      'kubeconfig',
      'x-headlamp-user-id',
    ]) {
      delete headers[h];
    }
    headers.host = api.host;
    headers.authorization = `Bearer ${token}`;
    return headers;
  }

  /** The request to the API server for a routed browser request. */
  function upstreamRequest(req, r) {
    return {
      protocol: 'https:',
      hostname: api.hostname,
      port: api.port,
      method: req.method,
      path: r.apiPath,
      headers: upstreamHeaders(req, r.token),
    };
  }

  const server = http.createServer((req, res) => {
    const url = req.url ?? '/';
    if (url.startsWith('/clusters/')) {
      const r = route(url);
      if (!r || r.unknown) {
        res.writeHead(404, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ message: `cluster not found: ${r?.unknown ?? url}` }));
        return;
      }
      log.push(`${req.method} ${r.name} ${r.apiPath}`);
      const upstream = https.request({ ...upstreamRequest(req, r), agent }, answer => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      });
      upstream.on('error', err => {
        if (!res.headersSent) res.writeHead(502, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ message: `API server unreachable: ${err.message}` }));
      });
      req.pipe(upstream);
      return;
    }
    if (url === '/config') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          clusters: Object.keys(clusters).map(name => ({ name, server: apiServer, auth_type: '' })),
          isDynamicClusterEnabled: false,
        })
      );
      return;
    }
    if (url === '/plugins') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify([{ name: pluginName, path: `plugins/${pluginName}`, type: 'shipped' }])
      );
      return;
    }
    const plugin = url.match(/^\/plugins\/([^/]+)\/(main\.js|package\.json)$/);
    if (plugin) {
      if (plugin[1] !== pluginName) {
        res.writeHead(404).end();
        return;
      }
      sendFile(res, path.join(pluginDir, plugin[2]));
      return;
    }
    const clean = decodeURIComponent(url.split('?')[0]);
    const file = path.join(pageDir, path.normalize(clean).replace(/^(\.\.[/\\])+/, ''));
    if (clean.startsWith('/assets/') && fs.existsSync(file)) {
      sendFile(res, file);
      return;
    }
    sendFile(res, path.join(pageDir, 'index.html'));
  });

  // WebSocket watches: the same proxying, over an upgraded connection.
  server.on('upgrade', (req, socket, head) => {
    const r = route(req.url ?? '');
    if (!r || r.unknown) {
      socket.end('HTTP/1.1 404 Not Found\r\n\r\n');
      return;
    }
    log.push(`WATCH ${r.name} ${r.apiPath}`);
    // A connection of its own (not the keep-alive agent's): it becomes the watch's socket.
    const upstream = https.request({ ...upstreamRequest(req, r), ca });
    upstream.on('upgrade', (answer, upSocket, upHead) => {
      const lines = [`HTTP/1.1 ${answer.statusCode} ${answer.statusMessage}`];
      for (let i = 0; i < answer.rawHeaders.length; i += 2) {
        lines.push(`${answer.rawHeaders[i]}: ${answer.rawHeaders[i + 1]}`);
      }
      socket.write(lines.join('\r\n') + '\r\n\r\n');
      if (upHead?.length) socket.write(upHead);
      if (head?.length) upSocket.write(head);
      upSocket.pipe(socket).pipe(upSocket);
      upSocket.on('error', () => socket.destroy());
      socket.on('error', () => upSocket.destroy());
    });
    upstream.on('response', answer => {
      log.push(`WATCH REFUSED ${answer.statusCode} ${r.name} ${r.apiPath}`);
      // The API server refused the upgrade (for example 403): pass its answer on and close.
      const lines = [`HTTP/1.1 ${answer.statusCode} ${answer.statusMessage}`, 'connection: close'];
      socket.write(lines.join('\r\n') + '\r\n\r\n');
      answer.pipe(socket);
    });
    upstream.on('error', () => socket.destroy());
    upstream.end();
  });

  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port ?? 0, '127.0.0.1', () => {
      const { port } = server.address();
      resolve({
        url: `http://127.0.0.1:${port}`,
        log,
        close: () =>
          new Promise(done => {
            server.closeAllConnections?.();
            server.close(() => done());
            agent.destroy();
          }),
      });
    });
  });
}
