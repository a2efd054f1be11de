// Prepares what the browser test serves: the plugin as Headlamp's plugin manager installs it (the
// release tarball, built by scripts/release.mjs and unpacked), and the page built from Headlamp's
// frontend components (test/browser/host), cached by the hash of its inputs under
// $PLATFORM_OPERATOR_CACHE/headlamp-test-host/ (default ~/.cache/platform-operator).
import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import * as tar from 'tar';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

function cacheDir() {
  const base =
    process.env.PLATFORM_OPERATOR_CACHE ?? path.join(os.homedir(), '.cache/platform-operator');
  return path.join(base, 'headlamp-test-host');
}

/** Builds (or reuses) the page; returns its folder. */
export function buildPage() {
  const hash = crypto.createHash('sha256');
  const hostDir = path.join(root, 'test/browser/host');
  for (const f of fs.readdirSync(hostDir).sort())
    hash.update(f).update(fs.readFileSync(path.join(hostDir, f)));
  hash.update(fs.readFileSync(path.join(root, 'package-lock.json')));
  const out = path.join(cacheDir(), hash.digest('hex').slice(0, 16));
  if (fs.existsSync(path.join(out, 'index.html'))) return out;
  const tmp = `${out}.tmp-${process.pid}`;
  fs.rmSync(tmp, { recursive: true, force: true });
  const env = Object.fromEntries(
    Object.entries(process.env).filter(
      ([k]) => !k.startsWith('VITEST') && k !== 'NODE_TEST_CONTEXT'
    )
  );
  execFileSync(
    path.join(root, 'node_modules/.bin/vite'),
    ['build', '-c', path.join(hostDir, 'vite.config.mjs')],
    { cwd: root, stdio: 'inherit', env: { ...env, NODE_ENV: 'production', HOST_OUT_DIR: tmp } }
  );
  fs.mkdirSync(path.dirname(out), { recursive: true });
  fs.rmSync(out, { recursive: true, force: true });
  fs.renameSync(tmp, out);
  return out;
}

/** Builds the release artefacts into `dir` and unpacks the tarball; returns the plugin folder. */
export async function releasedPlugin(dir) {
  execFileSync('node', [path.join(root, 'scripts/release.mjs'), '--out', dir], {
    cwd: root,
    stdio: 'inherit',
  });
  const pkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'));
  const unpacked = path.join(dir, 'unpacked');
  fs.mkdirSync(unpacked, { recursive: true });
  await tar.x({ file: path.join(dir, `${pkg.name}-${pkg.version}.tar.gz`), cwd: unpacked });
  return { dir: path.join(unpacked, pkg.name), name: pkg.name };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  console.log(buildPage());
}
