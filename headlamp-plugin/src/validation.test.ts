// @vitest-environment node
// The client-side rules agree with the CRD: every must-accept and must-reject example of the
// end-to-end CRD tests (e2e/tests/crd.rs, read here from the Rust source so a new case there is a
// new case here) gets the same verdict, on the same field, with the same reason; every CEL rule of
// the CRD has a client-side twin; src/generated/crd.json is what the CRD generates.
import YAML from 'yaml';
import { crdSchemaJson } from '../scripts/crd-schema.mjs';
import { fs, path } from './nodeBuiltins';
import {
  compileRule,
  rulesOf,
  specSchema,
  validateInstance,
  validateName,
  validateSpec,
} from './validation';

const repo = path.resolve(__dirname, '../..');
const read = (rel: string) => fs.readFileSync(path.join(repo, rel), 'utf8');
const crdTests = read('e2e/tests/crd.rs');
const crdYaml = read(
  'charts/platform-operator/crds/platforminstances.platform.di-framework.dev.yaml'
);
const exampleOne = read('docs/examples/one.yaml');
const committedSchema = read('headlamp-plugin/src/generated/crd.json');

/** The content of a Rust string literal (the escapes crd.rs uses). */
function rustString(literal: string): string {
  return literal
    .slice(1, -1)
    .replace(/\\\n\s*/g, '')
    .replace(/\\(n|"|\\|t)/g, (_, c) => ({ n: '\n', '"': '"', '\\': '\\', t: '\t' }[c as string]!));
}

const LIT = String.raw`"(?:[^"\\]|\\.)*"`;
const digest = rustString(crdTests.match(new RegExp(`const DIGEST: &str = (${LIT});`))![1]);

/** A `format!` template of crd.rs filled in (`{DIGEST}`, `{{`, `}}`). */
function formatted(template: string): string {
  return template
    .replace(/\{DIGEST\}/g, digest)
    .replace(/\{\{/g, '{')
    .replace(/\}\}/g, '}');
}

/** The instance document crd.rs builds with `instance(namespace, name, spec_extra)`. */
function instanceDoc(name: string, specExtra: string) {
  return YAML.parse(
    `apiVersion: platform.di-framework.dev/v1alpha1\nkind: PlatformInstance\nmetadata:\n  name: ${name}\n  namespace: ns\nspec:\n${specExtra}`
  );
}

interface Case {
  test: string;
  name: string;
  doc: any;
  accept: boolean;
  old?: any;
  field?: string;
  reason?: string;
}

function rejectedCases(): Case[] {
  const block = crdTests.slice(crdTests.indexOf('const REJECTED'));
  const body = block.slice(0, block.indexOf('\n];'));
  const tuple = new RegExp(
    String.raw`\(\s*(${LIT}),\s*(${LIT}),\s*(${LIT}),\s*(${LIT}),?\s*\)`,
    'g'
  );
  return [...body.matchAll(tuple)].map(m => {
    const [name, spec, field, reason] = m.slice(1, 5).map(rustString);
    return {
      test: 'REJECTED',
      name,
      doc: instanceDoc(name, spec),
      accept: false,
      field,
      reason,
    };
  });
}

/** Each `instance(&ns, "name", spec)` applied in a test, with the verdict its next assert wants. */
function appliedCases(): Case[] {
  const cases: Case[] = [];
  const fns = crdTests.split(/#\[tokio::test\]\s*async fn /).slice(1);
  for (const fn of fns) {
    const test = fn.slice(0, fn.indexOf('('));
    const specVar = fn.match(new RegExp(`let spec = format!\\(\\s*(${LIT})`));
    const call = new RegExp(String.raw`instance\(\s*&ns,\s*(${LIT}),\s*(${LIT}|&spec),?\s*\)`, 'g');
    const stored = new Map<string, any>();
    for (const m of fn.matchAll(call)) {
      const name = rustString(m[1]);
      const spec = m[2] === '&spec' ? formatted(rustString(specVar![1])) : rustString(m[2]);
      const after = fn.slice(m.index! + m[0].length);
      const verdict = after.match(/assert!\(\s*(!?)out\.success/);
      if (!verdict) throw new Error(`${test}: no assert on the outcome of applying ${name}`);
      const accept = verdict[1] === '';
      const doc = instanceDoc(name, spec);
      cases.push({ test, name, doc, accept, old: stored.get(name) });
      if (accept) stored.set(name, doc);
    }
    if (fn.includes('repo_file("docs/examples/one.yaml")')) {
      const doc = YAML.parse(exampleOne);
      cases.push({ test, name: 'docs/examples/one.yaml', doc, accept: true });
    }
  }
  return cases;
}

const rejected = rejectedCases();
const applied = appliedCases();

describe('agreement with the CRD end-to-end tests', () => {
  it('finds the cases of e2e/tests/crd.rs', () => {
    // crd.rs has 13 REJECTED cases and 8 applies; fewer means this reader lost some.
    expect(rejected.length).toBeGreaterThanOrEqual(13);
    expect(applied.filter(c => c.accept).length).toBeGreaterThanOrEqual(7);
    expect(applied.filter(c => !c.accept).length).toBeGreaterThanOrEqual(1);
  });

  it.each(rejected.map(c => [c.name, c] as const))(
    'rejects %s on the field the API server names, for its reason',
    (_, c) => {
      const errors = validateInstance(c.doc, c.old);
      expect(errors.length).toBeGreaterThan(0);
      const onField = errors.filter(e => e.path === c.field);
      expect(onField.map(e => e.message).join('\n')).toContain(c.reason);
    }
  );

  it.each(applied.map(c => [`${c.test}: ${c.name}`, c] as const))(
    'gives %s the same verdict',
    (_, c) => {
      const errors = validateInstance(c.doc, c.old);
      if (c.accept) {
        expect(errors).toEqual([]);
      } else {
        expect(errors.length).toBeGreaterThan(0);
      }
    }
  );

  it('checks the transition rule only against a stored object', () => {
    const changed = applied.find(c => !c.accept && c.old)!;
    expect(validateSpec(changed.doc.spec, changed.old.spec).map(e => e.path)).toContain(
      'spec.target.type'
    );
    const spec = { target: { type: 'vcluster' } };
    expect(validateSpec(spec)).toEqual([]);
    expect(validateSpec(spec, spec)).toEqual([]);
    const moved = validateSpec(spec, { target: { type: 'elsewhere' } });
    expect(moved).toHaveLength(1);
    expect(moved[0].message).toContain('is immutable');
  });
});

describe('rules read from the schema', () => {
  it('has a client-side twin for every CEL rule of the CRD', () => {
    const rules = rulesOf(specSchema);
    expect(rules.length).toBeGreaterThanOrEqual(7);
    for (const { rule } of rules) expect(() => compileRule(rule)).not.toThrow();
  });

  it('refuses a CEL rule it does not know', () => {
    expect(() => compileRule('self.size() > 2')).toThrow(/no client-side twin/);
  });

  it('is generated from the chart CRD as committed', () => {
    expect(committedSchema).toBe(crdSchemaJson(crdYaml));
  });

  it.each([
    ['6.0.22', true],
    ['6.1.0-rc.1', true],
    ['06.0.1', false],
    ['6.0', false],
    ['~6', false],
    ['6.x', false],
    ['>=6', false],
  ])('version %s accepted: %s', (version, ok) => {
    expect(validateSpec({ version }).length === 0).toBe(ok);
  });

  it.each([
    [0, true],
    [30000, true],
    [32767, true],
    [29999, false],
    [32768, false],
    [-1, false],
  ])('httpNodePort %d accepted: %s', (port, ok) => {
    expect(validateSpec({ platform: { gateway: { httpNodePort: port } } }).length === 0).toBe(ok);
  });

  it.each([
    ['http://apps.example:30080', true],
    ['https://apps.example', true],
    ['ftp://apps.example', false],
    ['apps.example', false],
    ['http://', false],
  ])('httpEndpoint %s accepted: %s', (url, ok) => {
    expect(validateSpec({ platform: { gateway: { httpEndpoint: url } } }).length === 0).toBe(ok);
  });

  it('checks digests, DNS labels, unique users and declared membership tenants', () => {
    const spec = {
      platform: {
        tenantHostImage: 'ghcr.io/x/wash:1.0',
        tenants: [{ name: 'Acme' }],
        users: [
          { name: 'dev', memberships: [{ tenant: 'ghost', role: 'developer' }] },
          { name: 'dev' },
        ],
      },
    };
    const paths = validateSpec(spec).map(e => e.path);
    expect(paths).toContain('spec.platform.tenantHostImage');
    expect(paths).toContain('spec.platform.tenants[0].name');
    expect(paths).toContain('spec.platform.users');
    const messages = validateSpec(spec)
      .map(e => e.message)
      .join('\n');
    expect(messages).toContain('duplicate entries for key [name="dev"]');
    expect(messages).toContain('declared in spec.platform.tenants');
  });

  it('checks names as the API server does', () => {
    expect(validateName('one')).toEqual([]);
    expect(validateName('One')[0].path).toBe('metadata.name');
    expect(validateName('')[0].message).toContain('Required value');
  });
});
