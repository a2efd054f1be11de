#!/usr/bin/env node
// Produces the release artefacts Headlamp's plugin manager expects, at the platform version:
//   release/di-framework-platform-<version>.tar.gz         (di-framework-platform/main.js + package.json)
//   release/di-framework-platform-<version>.tar.gz.sha256  (sha256sum format)
//   release/artifacthub-pkg.yml                             (Artifact Hub package, archive URL and checksum)
// The tarball is made by Headlamp's own toolchain (`headlamp-plugin build` and `package`).
// Usage: node scripts/release.mjs [--out DIR] [--no-build]
import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import YAML from 'yaml';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const repo = path.resolve(root, '..');
const args = process.argv.slice(2);
const outIdx = args.indexOf('--out');
const out = path.resolve(outIdx >= 0 ? args[outIdx + 1] : path.join(root, 'release'));
const pkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'));
const chart = YAML.parse(
  fs.readFileSync(path.join(repo, 'charts/platform-operator/Chart.yaml'), 'utf8')
);

/** Where the platform's GitHub release keeps the tarball (the chart's `home`). */
export const RELEASES = `${chart.home}/releases/download`;

if (pkg.version !== chart.version) {
  console.error(
    `package.json version ${pkg.version} differs from the chart's ${chart.version}: the plugin is released at the platform version; set both to the same`
  );
  process.exit(1);
}

const bin = path.join(root, 'node_modules/.bin/headlamp-plugin');
if (!args.includes('--no-build')) {
  execFileSync('node', [path.join(root, 'scripts/gen-schema.mjs'), '--check'], {
    stdio: 'inherit',
  });
  // A release is a production build whoever runs it (a test runner sets NODE_ENV=test).
  const env = Object.fromEntries(
    Object.entries(process.env).filter(([k]) => !k.startsWith('VITEST') && k !== 'UNDER_TEST')
  );
  execFileSync(bin, ['build', root], {
    cwd: root,
    stdio: 'inherit',
    env: { ...env, NODE_ENV: 'production' },
  });
}
fs.mkdirSync(out, { recursive: true });
const tarball = `${pkg.name}-${pkg.version}.tar.gz`;
fs.rmSync(path.join(out, tarball), { force: true });
// `headlamp-plugin package` names the top folder after the plugin's folder; stage one named
// after the package so the archive unpacks to di-framework-platform/.
const stage = fs.mkdtempSync(path.join(out, '.stage-'));
const staged = path.join(stage, pkg.name);
fs.mkdirSync(path.join(staged, 'dist'), { recursive: true });
fs.copyFileSync(path.join(root, 'dist/main.js'), path.join(staged, 'dist/main.js'));
fs.copyFileSync(path.join(root, 'package.json'), path.join(staged, 'package.json'));
try {
  execFileSync(bin, ['package', staged, out], { cwd: root, stdio: 'inherit' });
} finally {
  fs.rmSync(stage, { recursive: true, force: true });
}

const sha256 = crypto
  .createHash('sha256')
  .update(fs.readFileSync(path.join(out, tarball)))
  .digest('hex');
fs.writeFileSync(path.join(out, `${tarball}.sha256`), `${sha256}  ${tarball}\n`);

const artifacthub = {
  version: pkg.version,
  name: pkg.name,
  displayName: 'di-framework Platform Instances',
  createdAt: new Date(Number(process.env.SOURCE_DATE_EPOCH ?? 0) * 1000 || Date.now())
    .toISOString()
    .replace(/\.\d+Z$/, 'Z'),
  description: pkg.description,
  license: pkg.license,
  homeURL: chart.home,
  keywords: pkg.keywords,
  annotations: {
    'headlamp/plugin/archive-url': `${RELEASES}/v${pkg.version}/${tarball}`,
    'headlamp/plugin/archive-checksum': `SHA256:${sha256}`,
    'headlamp/plugin/version-compat': '>=0.46.0',
    'headlamp/plugin/distro-compat': 'in-cluster,web,docker-desktop,desktop',
  },
};
fs.writeFileSync(path.join(out, 'artifacthub-pkg.yml'), YAML.stringify(artifacthub));
console.log(
  `${path.join(out, tarball)}\nsha256 ${sha256}\n${path.join(out, 'artifacthub-pkg.yml')}`
);
