// Client-side rules for a PlatformInstance `spec`, interpreted from the CRD's own schema
// (src/generated/crd.json, written by scripts/gen-schema.mjs from the chart's CRD): types, enums,
// lengths, patterns, ranges, required fields, unknown fields, list-map keys and every
// x-kubernetes-validations (CEL) rule. CEL rules are compiled into JavaScript by shape; a rule of a
// shape this file does not know makes `compileRule` throw, so a new rule in the CRD fails the
// plugin's tests until it has a client-side twin.
import crd from './generated/crd.json';

/** One problem found in an object, at a field path such as `spec.platform.gateway.httpNodePort`. */
export interface FieldError {
  /** The field, as the API server names it (`spec.platform.tenants`). */
  path: string;
  /** What is wrong, in the API server's words where it has them. */
  message: string;
}

/** The subset of an OpenAPI v3 structural schema the CRD uses. */
export interface Schema {
  type?: string;
  description?: string;
  nullable?: boolean;
  enum?: unknown[];
  default?: unknown;
  pattern?: string;
  minLength?: number;
  maxLength?: number;
  minimum?: number;
  maximum?: number;
  maxItems?: number;
  required?: string[];
  properties?: Record<string, Schema>;
  items?: Schema;
  format?: string;
  'x-kubernetes-list-type'?: string;
  'x-kubernetes-list-map-keys'?: string[];
  'x-kubernetes-validations'?: { rule: string; message?: string; fieldPath?: string }[];
}

/** The `spec` schema of the CRD. */
export const specSchema: Schema = crd.spec as Schema;

/** A compiled CEL rule: returns true when `self` (and `oldSelf` on update) pass. */
export interface CompiledRule {
  /** Whether the rule compares with the stored object (`oldSelf`): checked on update only. */
  transition: boolean;
  /** Evaluates the rule. */
  check: (self: any, oldSelf?: any) => boolean;
}

/** Reads a CEL single-quoted string literal's content (the escapes CEL allows there). */
function celString(literal: string): string {
  return literal.replace(/\\(\\|')/g, '$1');
}

/** CEL's `isURL(s)`: Go's `url.ParseRequestURI` accepts an absolute URI or an absolute path. */
function celIsURL(s: string): boolean {
  if (typeof s !== 'string' || s === '' || /\s/.test(s)) return false;
  if (s.startsWith('/')) return true;
  return /^[A-Za-z][A-Za-z0-9+.-]*:/.test(s) && parseURL(s) !== null;
}

function parseURL(s: string): URL | null {
  try {
    return new URL(s);
  } catch {
    return null;
  }
}

const normalise = (rule: string) => rule.replace(/\s+/g, ' ').trim();

/** The CEL rule shapes the CRD uses, each with its JavaScript twin. */
const SHAPES: { re: RegExp; compile: (m: RegExpMatchArray) => CompiledRule }[] = [
  {
    // self.matches('<RE2 pattern>'), used for versions and image digests.
    re: /^self\.matches\('((?:[^'\\]|\\.)*)'\)$/,
    compile: m => {
      const re = new RegExp(celString(m[1]));
      return { transition: false, check: self => typeof self === 'string' && re.test(self) };
    },
  },
  {
    // self.matches('<RE2 pattern>') && self.contains('<text>') && ..., used for the route pattern.
    re: /^self\.matches\('((?:[^'\\]|\\.)*)'\)((?: && self\.contains\('(?:[^'\\]|\\.)*'\))+)$/,
    compile: m => {
      const re = new RegExp(celString(m[1]));
      const parts = [...m[2].matchAll(/self\.contains\('((?:[^'\\]|\\.)*)'\)/g)].map(x =>
        celString(x[1])
      );
      return {
        transition: false,
        check: self =>
          typeof self === 'string' && re.test(self) && parts.every(p => self.includes(p)),
      };
    },
  },
  {
    // isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != ''
    re: /^isURL\(self\) && url\(self\)\.getScheme\(\) in \[((?:'[a-z]+'(?:, )?)+)\] && url\(self\)\.getHostname\(\) != ''$/,
    compile: m => {
      const schemes = [...m[1].matchAll(/'([a-z]+)'/g)].map(x => x[1]);
      return {
        transition: false,
        check: self => {
          if (!celIsURL(self)) return false;
          const url = parseURL(self);
          return !!url && schemes.includes(url.protocol.replace(/:$/, '')) && url.hostname !== '';
        },
      };
    },
  },
  {
    // self == 0 || (self >= LOW && self <= HIGH)
    re: /^self == (\d+) \|\| \(self >= (\d+) && self <= (\d+)\)$/,
    compile: m => {
      const [zero, low, high] = [Number(m[1]), Number(m[2]), Number(m[3])];
      return {
        transition: false,
        check: self => self === zero || (self >= low && self <= high),
      };
    },
  },
  {
    // self.all(k, isQuantity(string(self[k]))): every value of a map is a Kubernetes quantity.
    re: /^self\.all\(k, isQuantity\(string\(self\[k\]\)\)\)$/,
    compile: () => {
      const quantity = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[mkMGTPE])?$/;
      return {
        transition: false,
        check: self =>
          !!self &&
          typeof self === 'object' &&
          Object.values(self).every(v => quantity.test(String(v))),
      };
    },
  },
  {
    // self.all(k, k.matches('<RE2 pattern>')): every key of a map matches.
    re: /^self\.all\(k, k\.matches\('((?:[^'\\]|\\.)*)'\)\)$/,
    compile: m => {
      const re = new RegExp(celString(m[1]));
      return {
        transition: false,
        check: self =>
          !!self && typeof self === 'object' && Object.keys(self).every(k => re.test(k)),
      };
    },
  },
  {
    // self == oldSelf: immutable once set.
    re: /^self == oldSelf$/,
    compile: () => ({ transition: true, check: (self, oldSelf) => self === oldSelf }),
  },
  {
    // !has(self.L) || self.L.all(u, !has(u.M) || u.M.all(m, has(self.T) && self.T.exists(t, t.K == m.F)))
    re: /^!has\(self\.(\w+)\) \|\| self\.\1\.all\((\w+), !has\(\2\.(\w+)\) \|\| \2\.\3\.all\((\w+), has\(self\.(\w+)\) && self\.\5\.exists\((\w+), \6\.(\w+) == \4\.(\w+)\)\)\)$/,
    compile: m => {
      const [list, inner, declared, key, field] = [m[1], m[3], m[5], m[7], m[8]];
      return {
        transition: false,
        check: self =>
          !Array.isArray(self?.[list]) ||
          self[list].every(
            (u: any) =>
              !Array.isArray(u?.[inner]) ||
              u[inner].every(
                (x: any) =>
                  Array.isArray(self[declared]) &&
                  self[declared].some((t: any) => t?.[key] === x?.[field])
              )
          ),
      };
    },
  },
];

/** Compiles one CEL rule of the CRD; throws for a rule of a shape not known here. */
export function compileRule(rule: string): CompiledRule {
  const text = normalise(rule);
  for (const shape of SHAPES) {
    const m = text.match(shape.re);
    if (m) return shape.compile(m);
  }
  throw new Error(`no client-side twin for the CRD's CEL rule: ${text}`);
}

/** Every CEL rule in a schema, with where it sits. */
export function rulesOf(schema: Schema, path = 'spec'): { path: string; rule: string }[] {
  const own = (schema['x-kubernetes-validations'] ?? []).map(v => ({ path, rule: v.rule }));
  const props = Object.entries(schema.properties ?? {}).flatMap(([k, s]) =>
    rulesOf(s, `${path}.${k}`)
  );
  const items = schema.items ? rulesOf(schema.items, `${path}[]`) : [];
  return [...own, ...props, ...items];
}

const compiled = new Map<string, CompiledRule>();
function ruleFor(rule: string): CompiledRule {
  let c = compiled.get(rule);
  if (!c) {
    c = compileRule(rule);
    compiled.set(rule, c);
  }
  return c;
}

function typeOf(v: unknown): string {
  if (Array.isArray(v)) return 'array';
  if (v === null) return 'null';
  if (typeof v === 'number') return Number.isInteger(v) ? 'integer' : 'number';
  return typeof v;
}

function quote(v: unknown): string {
  return typeof v === 'string' ? JSON.stringify(v) : String(v);
}

function walk(
  value: unknown,
  old: unknown,
  schema: Schema,
  path: string,
  errors: FieldError[]
): void {
  if (value === undefined) return;
  if (value === null) {
    if (!schema.nullable) errors.push({ path, message: 'Invalid value: "null": must not be null' });
    return;
  }
  const t = typeOf(value);
  const want = schema.type;
  if (want && !(want === t || (want === 'number' && t === 'integer'))) {
    errors.push({
      path,
      message: `Invalid value: "${t}": ${path} in body must be of type ${want}`,
    });
    return;
  }
  if (schema.enum && !schema.enum.includes(value)) {
    errors.push({
      path,
      message: `Unsupported value: ${quote(value)}: supported values: ${schema.enum
        .map(quote)
        .join(', ')}`,
    });
  }
  if (t === 'string') {
    const s = value as string;
    const len = [...s].length;
    if (schema.minLength !== undefined && len < schema.minLength) {
      errors.push({
        path,
        message: `Invalid value: ${quote(s)}: ${path} in body should be at least ${
          schema.minLength
        } chars long`,
      });
    }
    if (schema.maxLength !== undefined && len > schema.maxLength) {
      errors.push({
        path,
        message: `Too long: may not be more than ${schema.maxLength} bytes`,
      });
    }
    if (schema.pattern && !new RegExp(schema.pattern).test(s)) {
      errors.push({
        path,
        message: `Invalid value: ${quote(s)}: ${path} in body should match '${schema.pattern}'`,
      });
    }
  }
  if (t === 'integer' || t === 'number') {
    const n = value as number;
    if (schema.minimum !== undefined && n < schema.minimum) {
      errors.push({
        path,
        message: `Invalid value: ${n}: ${path} in body should be greater than or equal to ${schema.minimum}`,
      });
    }
    if (schema.maximum !== undefined && n > schema.maximum) {
      errors.push({
        path,
        message: `Invalid value: ${n}: ${path} in body should be less than or equal to ${schema.maximum}`,
      });
    }
  }
  if (t === 'array') {
    const a = value as unknown[];
    if (schema.maxItems !== undefined && a.length > schema.maxItems) {
      errors.push({
        path,
        message: `Too many: ${a.length}: must have at most ${schema.maxItems} items`,
      });
    }
    const listType = schema['x-kubernetes-list-type'];
    const keys = schema['x-kubernetes-list-map-keys'] ?? [];
    const seen = new Set<string>();
    a.forEach((item, i) => {
      if (listType === 'map' && item && typeof item === 'object') {
        const id = keys.map(k => `${k}=${quote((item as any)[k])}`).join(',');
        if (seen.has(id)) {
          errors.push({ path, message: `Duplicate value: duplicate entries for key [${id}]` });
        }
        seen.add(id);
      } else if (listType === 'set') {
        const id = JSON.stringify(item);
        if (seen.has(id))
          errors.push({ path: `${path}[${i}]`, message: `Duplicate value: ${quote(item)}` });
        seen.add(id);
      }
      if (schema.items) {
        const oldItem =
          listType === 'map' && Array.isArray(old)
            ? old.find(o => keys.every(k => (o as any)?.[k] === (item as any)?.[k]))
            : undefined;
        walk(item, oldItem, schema.items, `${path}[${i}]`, errors);
      }
    });
  }
  if (t === 'object' && schema.properties) {
    const o = value as Record<string, unknown>;
    const oldObj = old && typeof old === 'object' ? (old as Record<string, unknown>) : undefined;
    for (const r of schema.required ?? []) {
      if (o[r] === undefined) errors.push({ path: `${path}.${r}`, message: 'Required value' });
    }
    for (const [k, v] of Object.entries(o)) {
      const sub = schema.properties[k];
      if (!sub) {
        errors.push({ path: `${path}.${k}`, message: 'field not declared in schema' });
        continue;
      }
      walk(v, oldObj?.[k], sub, `${path}.${k}`, errors);
    }
  }
  for (const v of schema['x-kubernetes-validations'] ?? []) {
    const rule = ruleFor(v.rule);
    if (rule.transition && old === undefined) continue;
    let ok: boolean;
    try {
      ok = rule.check(value, old);
    } catch {
      ok = false;
    }
    if (!ok) {
      const at = v.fieldPath ? `${path}${v.fieldPath}` : path;
      const shown = typeof value === 'object' ? typeOf(value) : quote(value);
      errors.push({
        path: at,
        message: `Invalid value: ${shown}: ${v.message ?? `failed rule: ${normalise(v.rule)}`}`,
      });
    }
  }
}

/**
 * Checks `spec` as the CRD would: every schema rule and CEL rule, transition rules against
 * `oldSpec` when given (an update). Returns the problems, empty when the API server's schema
 * validation would accept it.
 */
export function validateSpec(spec: unknown, oldSpec?: unknown): FieldError[] {
  const errors: FieldError[] = [];
  if (spec === undefined || spec === null) return [{ path: 'spec', message: 'Required value' }];
  walk(spec, oldSpec, specSchema, 'spec', errors);
  return errors;
}

const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

/** Checks an object's name as the API server does for every custom resource (a DNS subdomain). */
export function validateName(name: string | undefined, path = 'metadata.name'): FieldError[] {
  if (!name) return [{ path, message: 'Required value: name or generateName is required' }];
  if (name.length > 253 || !DNS_SUBDOMAIN.test(name)) {
    return [
      {
        path,
        message: `Invalid value: ${quote(
          name
        )}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character`,
      },
    ];
  }
  return [];
}

/** Checks a whole object: its name, namespace and spec (against `old`'s spec on update). */
export function validateInstance(obj: any, old?: any): FieldError[] {
  const errors = [...validateName(obj?.metadata?.name)];
  if (!obj?.metadata?.namespace) {
    errors.push({ path: 'metadata.namespace', message: 'Required value' });
  }
  return [...errors, ...validateSpec(obj?.spec, old?.spec)];
}

/** The schema of the field at a dotted path under `spec` (`spec.platform.gateway`), if any. */
export function schemaAt(path: string): Schema | undefined {
  let s: Schema | undefined = specSchema;
  for (const part of path.split('.').slice(1)) {
    if (!s) return undefined;
    s = part === '[]' ? s.items : s.properties?.[part];
  }
  return s;
}
