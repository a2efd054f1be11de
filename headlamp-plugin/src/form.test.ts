// The form model: a stored object survives a round trip through the form unchanged; empty fields
// are left out; fields the form does not manage are kept; errors land on the fields' paths.
import { check, emptyForm, FIELD_PATHS, formFrom, messagesAt, toInstance, unplaced } from './form';
import { KubePlatformInstance } from './resource';

const DIGEST = '@sha256:ee89fd4bce4f9f35f4cd09c63d3cbdd07bea3071b5d372f82c9f49b9741c3669';

const stored: KubePlatformInstance = {
  apiVersion: 'platform.di-framework.dev/v1alpha1',
  kind: 'PlatformInstance',
  metadata: {
    name: 'full',
    namespace: 'team-a',
    resourceVersion: '7',
    uid: 'u',
    creationTimestamp: '2026-01-01T00:00:00Z',
    labels: { keep: 'me' },
  },
  spec: {
    version: '6.1.0-rc.1',
    target: { type: 'vcluster' },
    deletionPolicy: 'Delete',
    platform: {
      networkPolicyEngine: 'existing',
      gateway: { httpNodePort: 30080, httpEndpoint: 'http://apps.example:30080' },
      egressAllowedDestinations: ['api.example:443'],
      tenants: [{ name: 'acme' }, { name: 'beta' }],
      users: [{ name: 'dev', memberships: [{ tenant: 'acme', role: 'developer' }] }],
      tenantAuth: {
        image: `ghcr.io/di-framework/tenant-auth${DIGEST}`,
        issuer: 'https://id.example',
        clientId: 'console',
        clientSecretRef: { name: 'tenant-auth-oauth', key: 'clientSecret' },
        registry: { component: `ghcr.io/di-framework/oci-registry${DIGEST}` },
      },
      tenantHostImage: `ghcr.io/di-framework/wash:2.8.0-wasi-tls${DIGEST}`,
      tenantHostImagePullPolicy: 'IfNotPresent',
    },
  },
  status: { phase: 'Ready' },
} as any;

describe('the form model', () => {
  it('round-trips a stored object unchanged (status aside)', () => {
    const { object, errors } = check(formFrom(stored), stored);
    expect(errors).toEqual([]);
    const { status, ...rest } = stored as any;
    expect(status).toBeDefined();
    expect(object).toEqual(rest);
  });

  it('builds a minimal new object, leaving empty fields out', () => {
    const state = { ...emptyForm('team-a', '6.0.22'), name: 'one' };
    const { object, errors } = check(state);
    expect(errors).toEqual([]);
    expect(object).toEqual({
      apiVersion: 'platform.di-framework.dev/v1alpha1',
      kind: 'PlatformInstance',
      metadata: { name: 'one', namespace: 'team-a' },
      spec: {
        version: '6.0.22',
        deletionPolicy: 'Retain',
        target: { type: 'vcluster' },
        platform: { networkPolicyEngine: 'existing' },
      },
    });
  });

  it('reports every error on the path of the field that shows it', () => {
    const state = {
      ...emptyForm('team-a', '^6.0.0'),
      name: 'Bad_Name',
      httpNodePort: '80',
      httpEndpoint: 'apps.example',
      tenants: ['acme', 'acme'],
      users: [{ name: 'dev', memberships: [{ tenant: 'ghost', role: 'developer' }] }],
      tenantAuthEnabled: true,
      issuer: 'http://id.example',
      tenantAuthImage: 'ghcr.io/x/tenant-auth:6.0.22',
      tenantHostImage: 'ghcr.io/x/wash:1',
    };
    const { errors } = check(state);
    const at = (p: string) => messagesAt(errors, p).join(' ');
    expect(at(FIELD_PATHS.name)).toContain('RFC 1123');
    expect(at(FIELD_PATHS.version)).toContain('exact version');
    expect(at(FIELD_PATHS.httpNodePort)).toContain('30000-32767');
    expect(at(FIELD_PATHS.httpEndpoint)).toContain('absolute');
    expect(at(FIELD_PATHS.tenants)).toContain('duplicate entries for key [name="acme"]');
    expect(at(FIELD_PATHS.users)).toContain('declared in spec.platform.tenants');
    expect(at(FIELD_PATHS.issuer)).toContain('https://');
    expect(at(FIELD_PATHS.tenantAuthImage)).toContain('digest');
    expect(at(FIELD_PATHS.tenantHostImage)).toContain('digest');
    expect(at(FIELD_PATHS.clientId)).toContain('Required value');
    expect(at(FIELD_PATHS.clientSecretRef)).toContain('Required value');
    expect(unplaced(errors, Object.values(FIELD_PATHS))).toEqual([]);
  });

  it('keeps a non-number port as text so the schema names it', () => {
    const { errors } = check({ ...emptyForm('ns', '6.0.22'), name: 'x', httpNodePort: 'eighty' });
    expect(messagesAt(errors, FIELD_PATHS.httpNodePort).join()).toContain(
      'must be of type integer'
    );
  });

  it('keeps fields the form does not manage on edit', () => {
    const object = toInstance({ ...formFrom(stored), version: '6.1.0' }, stored);
    expect(object.metadata.labels).toEqual({ keep: 'me' });
    expect(object.spec.target).toEqual({ type: 'vcluster' });
    expect(object.spec.version).toBe('6.1.0');
    expect((object as any).status).toBeUndefined();
  });
});
