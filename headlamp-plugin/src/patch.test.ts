// The JSON Patch of an edit: only changed fields, guarded by the resourceVersion test, escaped
// pointers, and the conflict path told apart from other API errors.
import { applyPatch, CONFLICT_MESSAGE, diff, editPatch, isConflict, pointerToken } from './patch';

const original = {
  apiVersion: 'platform.di-framework.dev/v1alpha1',
  kind: 'PlatformInstance',
  metadata: { name: 'one', namespace: 'team-a', resourceVersion: '42', labels: { a: '1' } },
  spec: {
    version: '6.0.21',
    target: { type: 'vcluster' },
    deletionPolicy: 'Retain',
    platform: { gateway: { httpNodePort: 30080 }, tenants: [{ name: 'acme' }] },
  },
  status: { phase: 'Ready' },
};

describe('editPatch', () => {
  it('is empty when nothing changed', () => {
    expect(editPatch(original, JSON.parse(JSON.stringify(original)))).toEqual([]);
  });

  it('tests the resourceVersion first, then changes only what changed', () => {
    const edited = JSON.parse(JSON.stringify(original));
    edited.spec.version = '6.0.22';
    edited.spec.platform.tenants.push({ name: 'beta' });
    delete edited.spec.platform.gateway;
    edited.spec.platform.users = [{ name: 'dev' }];
    edited.status = { phase: 'Failed' }; // never sent
    const ops = editPatch(original, edited);
    expect(ops).toEqual([
      { op: 'test', path: '/metadata/resourceVersion', value: '42' },
      { op: 'remove', path: '/spec/platform/gateway' },
      {
        op: 'replace',
        path: '/spec/platform/tenants',
        value: [{ name: 'acme' }, { name: 'beta' }],
      },
      { op: 'add', path: '/spec/platform/users', value: [{ name: 'dev' }] },
      { op: 'replace', path: '/spec/version', value: '6.0.22' },
    ]);
    const applied = applyPatch(original, ops);
    expect(applied.spec).toEqual(edited.spec);
    expect(applied.status).toEqual(original.status);
  });

  it('ignores the order of keys (the API server returns them sorted)', () => {
    const stored = {
      metadata: { resourceVersion: '3' },
      spec: {
        platform: {
          users: [{ memberships: [{ role: 'developer', tenant: 'acme' }], name: 'dev' }],
        },
      },
    };
    const edited = {
      metadata: { resourceVersion: '3' },
      spec: {
        platform: {
          users: [{ name: 'dev', memberships: [{ tenant: 'acme', role: 'developer' }] }],
        },
      },
    };
    expect(editPatch(stored, edited)).toEqual([]);
  });

  it('adds a missing parent whole', () => {
    const bare = { metadata: { resourceVersion: '1' }, spec: { version: '6.0.22' } };
    const edited = {
      ...bare,
      spec: { version: '6.0.22', platform: { gateway: { httpNodePort: 30001 } } },
    };
    expect(editPatch(bare, edited)).toEqual([
      { op: 'test', path: '/metadata/resourceVersion', value: '1' },
      { op: 'add', path: '/spec/platform', value: { gateway: { httpNodePort: 30001 } } },
    ]);
  });

  it('escapes JSON Pointer tokens', () => {
    expect(pointerToken('a/b~c')).toBe('a~1b~0c');
    const ops = diff({ 'x/y': 1 }, { 'x/y': 2 }, '/metadata/labels');
    expect(ops).toEqual([{ op: 'replace', path: '/metadata/labels/x~1y', value: 2 }]);
    expect(applyPatch({ metadata: { labels: { 'x/y': 1 } } }, ops)).toEqual({
      metadata: { labels: { 'x/y': 2 } },
    });
  });

  it('fails its test against a newer object', () => {
    const edited = JSON.parse(JSON.stringify(original));
    edited.spec.version = '6.0.22';
    const ops = editPatch(original, edited);
    const newer = { ...original, metadata: { ...original.metadata, resourceVersion: '43' } };
    expect(() => applyPatch(newer, ops)).toThrow(/test .*resourceVersion failed/);
  });
});

describe('isConflict', () => {
  it('recognises the refused test and 409, nothing else', () => {
    expect(
      isConflict({
        status: 422,
        message:
          'Unprocessable Entity - the server rejected our request due to an error in our request: testing value /metadata/resourceVersion failed: test failed',
      })
    ).toBe(true);
    expect(isConflict({ status: 409, message: 'Conflict' })).toBe(true);
    expect(
      isConflict({
        status: 422,
        message:
          'Unprocessable Entity - the server rejected our request due to an error in our request',
        conflict: true,
      })
    ).toBe(true);
    expect(isConflict({ status: 422, message: 'spec.version: Invalid value' })).toBe(false);
    expect(isConflict({ status: 403, message: 'forbidden' })).toBe(false);
    expect(isConflict(null)).toBe(false);
    expect(CONFLICT_MESSAGE).toContain('changed since you opened it: reopen and retry');
  });
});
