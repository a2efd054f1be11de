// JSON Patch (RFC 6902) of only the fields an edit changed, guarded by a `test` of
// metadata.resourceVersion, and how a refusal of that test is told apart from other errors.

/** One JSON Patch operation. */
export interface PatchOp {
  op: 'add' | 'remove' | 'replace' | 'test';
  path: string;
  value?: unknown;
}

/** Escapes one JSON Pointer token (RFC 6901). */
export function pointerToken(key: string): string {
  return key.replace(/~/g, '~0').replace(/\//g, '~1');
}

const isObject = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === 'object' && !Array.isArray(v);

/** JSON text with every object's keys sorted: equal values, whatever their key order. */
function canonical(v: unknown): string {
  return JSON.stringify(v, (_, val) =>
    isObject(val)
      ? Object.fromEntries(Object.entries(val).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)))
      : val
  );
}

/** Whether two JSON values are equal (objects compared without regard to key order). */
const same = (a: unknown, b: unknown) => canonical(a) === canonical(b);

/**
 * The operations that turn `before` into `after` at `path`: objects are compared key by key,
 * anything else (numbers, strings, lists) is replaced whole when it differs.
 */
export function diff(before: unknown, after: unknown, path = ''): PatchOp[] {
  if (same(before, after)) return [];
  if (before === undefined) return [{ op: 'add', path, value: after }];
  if (after === undefined) return [{ op: 'remove', path }];
  if (!isObject(before) || !isObject(after)) return [{ op: 'replace', path, value: after }];
  const keys = [...new Set([...Object.keys(before), ...Object.keys(after)])].sort();
  return keys.flatMap(k => diff(before[k], after[k], `${path}/${pointerToken(k)}`));
}

/**
 * The patch an edit sends: a `test` that metadata.resourceVersion is still the one the form was
 * opened with, then the changes to `spec` (and to labels and annotations, if the edit touched
 * them). Empty when nothing changed.
 */
export function editPatch(original: any, edited: any): PatchOp[] {
  const changes = [
    ...diff(original?.metadata?.labels, edited?.metadata?.labels, '/metadata/labels'),
    ...diff(
      original?.metadata?.annotations,
      edited?.metadata?.annotations,
      '/metadata/annotations'
    ),
    ...diff(original?.spec, edited?.spec, '/spec'),
  ];
  if (changes.length === 0) return [];
  return [
    { op: 'test', path: '/metadata/resourceVersion', value: original?.metadata?.resourceVersion },
    ...changes,
  ];
}

/** Applies a patch to a copy of `doc` (for previews and tests; the API server applies the real one). */
export function applyPatch<T>(doc: T, ops: PatchOp[]): T {
  const root: any = JSON.parse(JSON.stringify(doc));
  for (const { op, path, value } of ops) {
    const tokens = path
      .split('/')
      .slice(1)
      .map(t => t.replace(/~1/g, '/').replace(/~0/g, '~'));
    const last = tokens.pop()!;
    let parent = root;
    for (const t of tokens) {
      if (!isObject(parent[t]) && !Array.isArray(parent[t])) {
        throw new Error(`${op} ${path}: ${t} is missing`);
      }
      parent = parent[t];
    }
    if (op === 'test') {
      if (!same(parent[last], value)) throw new Error(`test ${path} failed`);
    } else if (op === 'remove') {
      if (!(last in parent)) throw new Error(`remove ${path}: missing`);
      delete parent[last];
    } else if (op === 'replace') {
      if (!(last in parent)) throw new Error(`replace ${path}: missing`);
      parent[last] = value;
    } else {
      parent[last] = value;
    }
  }
  return root;
}

/** What the plugin tells a user whose edit lost a race with another change. */
export const CONFLICT_MESSAGE =
  'This instance has changed since you opened it: reopen and retry. Nothing was overwritten.';

/**
 * Whether an API error is the refusal of the resourceVersion `test`: marked `conflict` by the
 * sender after it saw the object's resourceVersion had moved on, or a 409, or a 422 whose message
 * names the failed test.
 */
export function isConflict(
  err: { status?: number; message?: string; conflict?: boolean } | null | undefined
): boolean {
  if (!err) return false;
  if (err.conflict === true) return true;
  if (err.status === 409) return true;
  return err.status === 422 && /test.*fail|resourceVersion/i.test(err.message ?? '');
}
