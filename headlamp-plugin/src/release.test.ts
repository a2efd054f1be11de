// @vitest-environment node
// The release artefacts: scripts/release.mjs builds with Headlamp's toolchain and packs a tarball
// that unpacks to what Headlamp loads (di-framework-platform/main.js + package.json), its sha256
// file and the Artifact Hub package agree with the bytes, and everything is at the chart's
// version, which the chart's plugin manager configuration names.
import * as tar from 'tar';
import YAML from 'yaml';
import { childProcess, crypto, fs, os, path } from './nodeBuiltins';

const { execFileSync } = childProcess;

const root = path.resolve(__dirname, '..');
const repo = path.resolve(root, '..');

describe('release artefacts', () => {
  const out = fs.mkdtempSync(path.join(os.tmpdir(), 'di-framework-platform-release-'));
  const pkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'));
  const chart = YAML.parse(
    fs.readFileSync(path.join(repo, 'charts/platform-operator/Chart.yaml'), 'utf8')
  );
  const tarball = path.join(out, `di-framework-platform-${pkg.version}.tar.gz`);

  beforeAll(() => {
    execFileSync('node', [path.join(root, 'scripts/release.mjs'), '--out', out], {
      cwd: root,
      stdio: 'pipe',
    });
  }, 180_000);
  afterAll(() => fs.rmSync(out, { recursive: true, force: true }));

  it('is at the platform version, which the chart names for the plugin manager', () => {
    expect(pkg.name).toBe('di-framework-platform');
    expect(pkg.version).toBe(chart.version);
    const values = YAML.parse(
      fs.readFileSync(path.join(repo, 'charts/platform-operator/values.yaml'), 'utf8')
    );
    const plugins = YAML.parse(values.headlamp.pluginsManager.configContent).plugins;
    expect(plugins).toEqual([
      {
        name: pkg.name,
        source: `https://artifacthub.io/packages/headlamp/${pkg.name}/${pkg.name}`,
        version: chart.version,
      },
    ]);
  });

  it('unpacks to what Headlamp loads: main.js and package.json', async () => {
    const entries: string[] = [];
    await tar.t({ file: tarball, onReadEntry: e => entries.push(e.path) });
    expect(entries.filter(e => !e.endsWith('/')).sort()).toEqual([
      'di-framework-platform/main.js',
      'di-framework-platform/package.json',
    ]);
    const dir = fs.mkdtempSync(path.join(out, 'unpacked-'));
    await tar.x({ file: tarball, cwd: dir });
    const main = fs.readFileSync(path.join(dir, 'di-framework-platform/main.js'), 'utf8');
    expect(main).toBe(fs.readFileSync(path.join(root, 'dist/main.js'), 'utf8'));
    // A UMD bundle that takes Headlamp's libraries from pluginLib and registers its views.
    expect(main).toContain('pluginLib');
    expect(main).toContain('Platform Instances');
    const unpackedPkg = JSON.parse(
      fs.readFileSync(path.join(dir, 'di-framework-platform/package.json'), 'utf8')
    );
    expect([unpackedPkg.name, unpackedPkg.version]).toEqual([pkg.name, pkg.version]);
  });

  it('has a sha256 and an Artifact Hub package that match the tarball', () => {
    const sha = crypto.createHash('sha256').update(fs.readFileSync(tarball)).digest('hex');
    const sumLine = fs.readFileSync(`${tarball}.sha256`, 'utf8');
    expect(sumLine).toBe(`${sha}  ${path.basename(tarball)}\n`);
    const hub = YAML.parse(fs.readFileSync(path.join(out, 'artifacthub-pkg.yml'), 'utf8'));
    expect(hub.version).toBe(pkg.version);
    expect(hub.name).toBe(pkg.name);
    expect(hub.annotations['headlamp/plugin/archive-checksum']).toBe(`SHA256:${sha}`);
    expect(hub.annotations['headlamp/plugin/archive-url']).toBe(
      `${chart.home}/releases/download/v${pkg.version}/${path.basename(tarball)}`
    );
    expect(hub.annotations['headlamp/plugin/version-compat']).toBe('>=0.46.0');
  });
});
