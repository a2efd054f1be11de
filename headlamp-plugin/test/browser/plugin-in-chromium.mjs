// The plugin in a real headless Chromium (Debian's /usr/bin/chromium driven by playwright-core),
// loaded by Headlamp's own plugin loader into a page of Headlamp's frontend components, talking
// through the stand-in for Headlamp's backend to the real local API server of the e2e harness.
//
// Run by e2e/tests/headlamp.rs, which starts the API server, applies the CRD and RBAC and passes:
//   PO_API_SERVER, PO_CA_FILE, PO_NAMESPACE, PO_TOKEN_ALICE (may read the kubeconfig Secret),
//   PO_TOKEN_BOB (may not), PO_TOKEN_STATUS (writes status and Events, as the controller would),
//   PO_SCREENSHOTS (where the screenshots go).
// `node --test test/browser/plugin-in-chromium.mjs` with those set runs it by hand (vitest,
// which runs *.test.* files, leaves it alone).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { chromium } from 'playwright-core';
import { buildPage, releasedPlugin } from './prepare.mjs';
import { startStandinBackend } from './standin-backend.mjs';

const env = name => {
  const v = process.env[name];
  if (!v)
    throw new Error(`${name} is not set: run this test through cargo test -p e2e --test headlamp`);
  return v;
};

const API = env('PO_API_SERVER');
const CA = fs.readFileSync(env('PO_CA_FILE'));
const NS = env('PO_NAMESPACE');
const TOKENS = {
  alice: env('PO_TOKEN_ALICE'),
  bob: env('PO_TOKEN_BOB'),
  status: env('PO_TOKEN_STATUS'),
};
const SHOTS = env('PO_SCREENSHOTS');
const GROUP = 'platform.di-framework.dev/v1alpha1';
const NAME = 'one';
const DIGEST = '@sha256:ee89fd4bce4f9f35f4cd09c63d3cbdd07bea3071b5d372f82c9f49b9741c3669';
// A bound on each wait (no timing is asserted): generous, for a loaded CI machine.
const TIMEOUT = 60_000;
// The bound on opening a page: the first evaluation of Headlamp's frontend bundle and the
// plugin's load take the most CPU of the whole test, and on a loaded machine (CI runs this beside
// other test binaries) they have taken over a minute. Still only a bound: nothing is timed.
const PAGE_TIMEOUT = 300_000;

/** One request to the API server as `user`; resolves to { status, body }. */
function api(user, method, apiPath, body, contentType = 'application/json') {
  return new Promise((resolve, reject) => {
    const url = new URL(apiPath, API);
    const req = https.request(
      url,
      {
        method,
        ca: CA,
        headers: {
          authorization: `Bearer ${TOKENS[user]}`,
          accept: 'application/json',
          ...(body ? { 'content-type': contentType } : {}),
        },
      },
      res => {
        let text = '';
        res.on('data', c => (text += c));
        res.on('end', () => {
          let parsed = text;
          try {
            parsed = JSON.parse(text);
          } catch {
            // not JSON
          }
          resolve({ status: res.statusCode, body: parsed });
        });
      }
    );
    req.on('error', reject);
    if (body) req.write(typeof body === 'string' ? body : JSON.stringify(body));
    req.end();
  });
}

const instancePath = `/apis/${GROUP}/namespaces/${NS}/platforminstances/${NAME}`;
const getInstance = () => api('alice', 'GET', instancePath);

/** Writes status through the status subresource, as the controller does. */
async function writeStatus(status) {
  const r = await api(
    'status',
    'PATCH',
    `${instancePath}/status`,
    { status },
    'application/merge-patch+json'
  );
  assert.equal(r.status, 200, `status write: ${JSON.stringify(r.body)}`);
}

let backend;
let browser;
let work;
/** Origins other than the stand-in backend that a page asked for (refused). */
const offsite = new Set();

before(async () => {
  work = fs.mkdtempSync(path.join(os.tmpdir(), 'headlamp-browser-'));
  const plugin = await releasedPlugin(work);
  const pageDir = buildPage();
  backend = await startStandinBackend({
    apiServer: API,
    ca: CA,
    clusters: { alice: TOKENS.alice, bob: TOKENS.bob },
    pluginDir: plugin.dir,
    pluginName: plugin.name,
    pageDir,
  });
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--disable-dev-shm-usage',
    ],
  });
  fs.mkdirSync(SHOTS, { recursive: true });
});

after(async () => {
  await browser?.close();
  await backend?.close();
  if (work) fs.rmSync(work, { recursive: true, force: true });
});

/** A page of Headlamp as `user` (each user is a cluster of the stand-in backend). */
async function open(user, route) {
  const context = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
  const page = await context.newPage();
  page.setDefaultTimeout(TIMEOUT);
  const errors = [];
  page.on('pageerror', e => errors.push(String(e)));
  page.on('console', m => {
    if (m.type() === 'error') errors.push(m.text());
  });
  // The page may only reach the stand-in backend. Anything else (there is no internet here) is
  // refused at once and noted, rather than left to a DNS lookup that can hold the page's load.
  const origin = new URL(backend.url).origin;
  await context.route(
    url => url.origin !== origin,
    r => {
      offsite.add(new URL(r.request().url()).origin);
      return r.abort('blockedbyclient');
    }
  );
  // Each step waits for what it needs on the page; the navigation itself waits only for the
  // document, not for every sub-resource.
  await page.goto(`${backend.url}/c/${user}${route}`, {
    waitUntil: 'domcontentloaded',
    timeout: PAGE_TIMEOUT,
  });
  return { page, errors, close: () => context.close() };
}

/** The input labelled `label` (MUI adds " *" to required fields' labels). */
const field = (scope, label) =>
  scope.getByLabel(new RegExp(`^${label.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}\\s*\\*?$`));

/** Picks `option` in the MUI select labelled `label` (its name is the label and the value). */
async function choose(page, scope, label, option) {
  await scope.getByRole('combobox', { name: new RegExp(`^${label}`) }).click();
  await page.getByRole('option', { name: option, exact: true }).click();
}

async function shot(page, name) {
  await page.screenshot({ path: path.join(SHOTS, `${name}.png`), fullPage: false });
}

async function until(what, fn, ms = TIMEOUT) {
  const deadline = Date.now() + ms;
  let last;
  while (Date.now() < deadline) {
    last = await fn();
    if (last) return last;
    await new Promise(r => setTimeout(r, 250));
  }
  throw new Error(`timed out waiting for ${what}`);
}

test(
  'create, watch, edit, conflict, detail, kubeconfig by RBAC, delete',
  { timeout: 1_200_000 },
  async top => {
    const alice = await open('alice', '/platform-instances');
    const { page } = alice;
    // Each step needs the ones before it: after a failure the rest are skipped.
    let broken = false;
    const t = {
      test: (name, fn) =>
        top.test(name, async sub => {
          if (broken) return sub.skip('an earlier step failed');
          try {
            await fn(sub);
          } catch (err) {
            broken = true;
            const file = `failed-${name.replace(/\W+/g, '-').slice(0, 40)}`;
            await shot(page, file).catch(() => {});
            throw err;
          }
        }),
      diagnostic: msg => top.diagnostic(msg),
    };
    try {
      // The sidebar entry and the list, from the plugin the loader fetched.
      await page.getByText('Platform Instances').first().waitFor({ timeout: PAGE_TIMEOUT });
      await page.getByRole('heading', { name: 'Platform Instances' }).waitFor();

      await t.test('the form refuses bad input beside the field and sends nothing', async () => {
        // Scoped to the page's main area: Headlamp's sidebar has a Create button of its own.
        await page.getByRole('main').getByRole('button', { name: 'Create', exact: true }).click();
        const dialog = page.getByRole('dialog');
        await field(dialog, 'Name').fill(NAME);
        await field(dialog, 'Namespace').fill(NS);
        await field(dialog, 'Version').fill('^6.0.0');
        await field(dialog, 'HTTP NodePort').fill('80');
        await dialog.getByText('must be an exact version').waitFor();
        await dialog.getByText('must be 0 (not published) or a NodePort in 30000-32767').waitFor();
        assert.equal(
          await dialog.getByRole('button', { name: 'Create', exact: true }).isDisabled(),
          true
        );
        await shot(page, 'form-validation-error');
        assert.equal((await getInstance()).status, 404, 'nothing reached the API server');
      });

      await t.test('creates through the form; Show YAML is the object sent', async () => {
        const dialog = page.getByRole('dialog');
        await field(dialog, 'Version').fill('6.0.22');
        await field(dialog, 'HTTP NodePort').fill('30080');
        await field(dialog, 'HTTP endpoint').fill('http://apps.example:30080');
        await choose(page, dialog, 'Deletion policy', 'Retain');
        await dialog.getByRole('button', { name: 'Add tenant' }).click();
        await field(dialog, 'Tenant 1').fill('acme');
        await dialog.getByRole('button', { name: 'Add user' }).click();
        await field(dialog, 'User 1').fill('dev');
        await dialog.getByRole('button', { name: 'Add membership to user 1' }).click();
        await dialog.getByLabel('Tenant console login (OAuth)').check();
        await field(dialog, 'Issuer').fill('https://id.example');
        await field(dialog, 'Client ID').fill('console');
        // The Secret and its key are chosen from the namespace's Secrets (alice may list them).
        await choose(page, dialog, 'Client secret: Secret', 'tenant-auth-oauth');
        await choose(page, dialog, 'Client secret: key', 'clientSecret');
        await field(dialog, 'Tenant auth image').fill(`ghcr.io/di-framework/tenant-auth${DIGEST}`);
        await dialog.getByRole('button', { name: 'Show YAML' }).click();
        const yaml = await dialog.getByLabel('YAML that will be sent').textContent();
        assert.match(yaml, /version: 6\.0\.22/);
        assert.match(yaml, /clientSecretRef:\s+name: tenant-auth-oauth\s+key: clientSecret/);
        await dialog.getByRole('button', { name: 'Back to form' }).click();
        await dialog.getByRole('button', { name: 'Create', exact: true }).click();
        await dialog.waitFor({ state: 'detached' });
        const stored = await until('the instance on the API server', async () => {
          const r = await getInstance();
          return r.status === 200 && r.body;
        });
        assert.deepEqual(stored.spec.platform.users, [
          { name: 'dev', memberships: [{ tenant: 'acme', role: 'developer' }] },
        ]);
        assert.equal(stored.spec.platform.tenantAuth.clientSecretRef.key, 'clientSecret');
        assert.equal(stored.spec.platform.gateway.httpNodePort, 30080);
        assert.equal(stored.spec.version, '6.0.22');
      });

      await t.test('the list shows it and follows its phase live', async () => {
        const row = page.getByRole('row').filter({ hasText: NAME });
        await row.getByText('Pending').waitFor();
        await writeStatus({ phase: 'Installing', version: '6.0.22' });
        await row.getByText('Installing').waitFor();
        const now = new Date().toISOString().replace(/\.\d+Z$/, 'Z');
        await writeStatus({
          phase: 'Ready',
          observedGeneration: 1,
          version: '6.0.22',
          installedVersion: '6.0.22',
          hostNamespace: `pi-${NS}-${NAME}-0a1b2c3d`.slice(0, 63),
          kubeconfigSecretRef: { name: `${NAME}-kubeconfig`, key: 'kubeconfig' },
          endpoints: {
            http: 'http://apps.example:30080',
            routeUrlPattern: 'http://<route-host>.<tenant>.localhost:28080/',
          },
          lastInstall: {
            result: 'Succeeded',
            version: '6.0.22',
            startedAt: now,
            finishedAt: now,
            message: 'installed 6.0.22',
            summary: { created: 12, updated: 0, deleted: 0, unchanged: 0, configHash: 'c0ffee' },
          },
          conditions: [
            {
              type: 'Ready',
              status: 'True',
              reason: 'Installed',
              message: 'the platform 6.0.22 is installed and serving',
              lastTransitionTime: now,
            },
            {
              type: 'Reconciling',
              status: 'False',
              reason: 'Installed',
              message: 'nothing to do',
              lastTransitionTime: now,
            },
            {
              type: 'Stalled',
              status: 'False',
              reason: 'Installed',
              message: 'nothing is stuck',
              lastTransitionTime: now,
            },
          ],
        });
        await row.getByText('Ready').first().waitFor();
        await row.getByText('True').waitFor();
        await shot(page, 'list');
      });

      await t.test(
        'the detail view shows spec, status, last install, conditions and Events',
        async () => {
          const uid = (await getInstance()).body.metadata.uid;
          const event = await api('status', 'POST', `/api/v1/namespaces/${NS}/events`, {
            metadata: { generateName: `${NAME}.` },
            involvedObject: {
              apiVersion: GROUP,
              kind: 'PlatformInstance',
              name: NAME,
              namespace: NS,
              uid,
            },
            reason: 'Installed',
            message: 'installed @di-framework/platform 6.0.22',
            type: 'Normal',
            source: { component: 'platform-operator' },
            firstTimestamp: new Date().toISOString(),
            lastTimestamp: new Date().toISOString(),
            count: 1,
          });
          assert.equal(event.status, 201, JSON.stringify(event.body));
          await page.getByRole('link', { name: NAME, exact: true }).click();
          await page.getByText('Last install').first().waitFor();
          await page.getByText('installed 6.0.22').first().waitFor();
          await page.getByText('the platform 6.0.22 is installed and serving').first().waitFor();
          await page.getByText('http://<route-host>.<tenant>.localhost:28080/').first().waitFor();
          await page.getByText(`pi-${NS}-${NAME}`).first().waitFor();
          await page.getByText('installed @di-framework/platform 6.0.22').first().waitFor();
          await page.getByText('acme (developer)').first().waitFor();
        }
      );

      await t.test(
        'edit sends a JSON Patch of the change, guarded by resourceVersion',
        async () => {
          const before = (await getInstance()).body;
          await page.getByRole('button', { name: 'Edit', exact: true }).click();
          const dialog = page.getByRole('dialog');
          await field(dialog, 'Version').fill('6.0.23');
          await dialog.getByRole('button', { name: 'Show patch' }).click();
          const shown = JSON.parse(
            await dialog.getByLabel('JSON Patch that will be sent').textContent()
          );
          assert.deepEqual(shown, [
            {
              op: 'test',
              path: '/metadata/resourceVersion',
              value: before.metadata.resourceVersion,
            },
            { op: 'replace', path: '/spec/version', value: '6.0.23' },
          ]);
          await shot(page, 'patch');
          const sent = backend.log.length;
          await dialog.getByRole('button', { name: 'Save' }).click();
          await dialog.waitFor({ state: 'detached' });
          const afterEdit = await until('the edit on the API server', async () => {
            const r = (await getInstance()).body;
            return r.spec.version === '6.0.23' && r;
          });
          assert.deepEqual(
            { ...afterEdit.spec, version: '6.0.22' },
            before.spec,
            'only the version changed'
          );
          assert.ok(
            backend.log
              .slice(sent)
              .some(
                l =>
                  l ===
                  `PATCH alice /apis/${GROUP}/namespaces/${NS}/platforminstances/${NAME}?fieldValidation=Strict`
              ),
            backend.log.slice(sent).join('\n')
          );
          await page.getByText('6.0.23 (installed 6.0.22)').first().waitFor();
          await shot(page, 'detail');
        }
      );

      await t.test('a concurrent change is refused, not overwritten', async () => {
        await page.getByRole('button', { name: 'Edit', exact: true }).click();
        const dialog = page.getByRole('dialog');
        await field(dialog, 'Version').fill('6.0.24');
        // Someone else changes the instance while the form is open.
        const other = await api(
          'alice',
          'PATCH',
          instancePath,
          { spec: { deletionPolicy: 'Delete' } },
          'application/merge-patch+json'
        );
        assert.equal(other.status, 200, JSON.stringify(other.body));
        await dialog.getByRole('button', { name: 'Save' }).click();
        await dialog.getByText('changed since you opened it: reopen and retry').waitFor();
        const stored = (await getInstance()).body;
        assert.equal(stored.spec.version, '6.0.23', 'the edit did not overwrite');
        assert.equal(stored.spec.deletionPolicy, 'Delete', 'the concurrent change survives');
        await dialog.getByRole('button', { name: 'Cancel' }).click();
      });

      await t.test('the kubeconfig is read on Show with the user’s credentials', async () => {
        const before = backend.log.filter(l => l.includes('/secrets/one-kubeconfig')).length;
        assert.equal(before, 0, 'not read before Show');
        await page.getByRole('button', { name: 'Show', exact: true }).click();
        await page.getByText('current-context: one-admin').waitFor();
        assert.ok(
          backend.log.some(l => l === `GET alice /api/v1/namespaces/${NS}/secrets/one-kubeconfig`)
        );
      });

      await t.test('a user RBAC denies gets a 403, shown as such', async () => {
        const bob = await open('bob', `/platform-instances/${NS}/${NAME}`);
        try {
          await bob.page.getByText('Last install').waitFor({ timeout: PAGE_TIMEOUT });
          await bob.page.getByRole('button', { name: 'Show', exact: true }).click();
          await bob.page
            .getByText(`Forbidden (403): you are not allowed to read Secret ${NS}/one-kubeconfig`)
            .waitFor();
          await bob.page.getByText('cannot get resource "secrets"').waitFor();
          assert.equal(await bob.page.getByText('current-context: one-admin').count(), 0);
        } finally {
          await bob.close();
        }
      });

      await t.test('delete says what deletionPolicy does, then deletes', async () => {
        await page.getByRole('button', { name: 'Delete', exact: true }).click();
        const dialog = page.getByRole('dialog');
        await dialog.getByText('deletionPolicy is Delete').waitFor();
        await dialog.getByText('removed').waitFor();
        // Headlamp's ConfirmDialog labels its confirm button for assistive technology.
        await dialog.getByRole('button', { name: 'confirm-button' }).click();
        await until('the instance to be gone', async () => (await getInstance()).status === 404);
        await page.getByRole('heading', { name: 'Platform Instances' }).waitFor();
        await page.getByRole('row').filter({ hasText: NAME }).waitFor({ state: 'detached' });
      });
    } finally {
      if (alice.errors.length) t.diagnostic(`page errors: ${alice.errors.slice(0, 20).join('\n')}`);
      if (offsite.size) t.diagnostic(`refused off-site origins: ${[...offsite].join(', ')}`);
      if (broken) t.diagnostic(`stand-in backend log:\n${backend.log.join('\n')}`);
      await alice.close();
    }
  }
);
