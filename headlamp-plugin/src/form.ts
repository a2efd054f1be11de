// The Create and Edit forms' model: what the fields hold, how they become the object sent to the
// API server (nothing empty, nothing half-built, every field the form does not manage kept), and
// which field paths the errors belong to.
import { API_VERSION, KubePlatformInstance } from './resource';
import { FieldError, validateInstance } from './validation';

/** One user row of the form. */
export interface UserRow {
  name: string;
  memberships: { tenant: string; role: string }[];
}

/** Everything the form's fields hold, as typed. */
export interface FormState {
  name: string;
  namespace: string;
  version: string;
  deletionPolicy: string;
  networkPolicyEngine: string;
  httpNodePort: string;
  httpEndpoint: string;
  egressAllowedDestinations: string;
  tenants: string[];
  users: UserRow[];
  tenantAuthEnabled: boolean;
  issuer: string;
  clientId: string;
  clientSecretName: string;
  clientSecretKey: string;
  tenantAuthImage: string;
  registryComponent: string;
  tenantHostImage: string;
  tenantHostImagePullPolicy: string;
}

/** The form for a new instance in `namespace`. */
export function emptyForm(namespace = '', version = ''): FormState {
  return {
    name: '',
    namespace,
    version,
    deletionPolicy: 'Retain',
    networkPolicyEngine: 'existing',
    httpNodePort: '',
    httpEndpoint: '',
    egressAllowedDestinations: '',
    tenants: [],
    users: [],
    tenantAuthEnabled: false,
    issuer: '',
    clientId: '',
    clientSecretName: '',
    clientSecretKey: '',
    tenantAuthImage: '',
    registryComponent: '',
    tenantHostImage: '',
    tenantHostImagePullPolicy: '',
  };
}

/** The form holding an existing instance. */
export function formFrom(obj: KubePlatformInstance): FormState {
  const p = obj.spec?.platform ?? {};
  const auth = p.tenantAuth;
  return {
    name: obj.metadata?.name ?? '',
    namespace: obj.metadata?.namespace ?? '',
    version: obj.spec?.version ?? '',
    deletionPolicy: obj.spec?.deletionPolicy ?? 'Retain',
    networkPolicyEngine: p.networkPolicyEngine ?? '',
    httpNodePort:
      p.gateway?.httpNodePort === undefined || p.gateway?.httpNodePort === null
        ? ''
        : String(p.gateway.httpNodePort),
    httpEndpoint: p.gateway?.httpEndpoint ?? '',
    egressAllowedDestinations: (p.egressAllowedDestinations ?? []).join('\n'),
    tenants: (p.tenants ?? []).map(t => t.name),
    users: (p.users ?? []).map(u => ({
      name: u.name,
      memberships: (u.memberships ?? []).map(m => ({ tenant: m.tenant, role: m.role })),
    })),
    tenantAuthEnabled: !!auth,
    issuer: auth?.issuer ?? '',
    clientId: auth?.clientId ?? '',
    clientSecretName: auth?.clientSecretRef?.name ?? '',
    clientSecretKey: auth?.clientSecretRef?.key ?? '',
    tenantAuthImage: auth?.image ?? '',
    registryComponent: auth?.registry?.component ?? '',
    tenantHostImage: p.tenantHostImage ?? '',
    tenantHostImagePullPolicy: p.tenantHostImagePullPolicy ?? '',
  };
}

/** Sets `obj[key]` to `value`, or removes the key when `value` is empty. */
function put(obj: Record<string, any>, key: string, value: unknown) {
  const empty =
    value === undefined ||
    value === '' ||
    (Array.isArray(value) && value.length === 0) ||
    (value !== null &&
      typeof value === 'object' &&
      !Array.isArray(value) &&
      Object.keys(value).length === 0);
  if (empty) delete obj[key];
  else obj[key] = value;
}

/** A number when the text is one, else the text itself (so the schema's type check names it). */
function numberOrText(text: string): number | string {
  const t = text.trim();
  return /^-?\d+$/.test(t) ? Number(t) : t;
}

const trimmed = (s: string) => s.trim();

/**
 * The object the form sends: `base` (the stored object on edit) with the fields the form manages
 * set from `state`. Empty fields are left out; fields the form does not manage are kept as they
 * were; status and server-set metadata are never sent.
 */
export function toInstance(state: FormState, base?: KubePlatformInstance): KubePlatformInstance {
  const copy: any = base ? JSON.parse(JSON.stringify(base)) : {};
  delete copy.status;
  const metadata: Record<string, any> = base
    ? copy.metadata
    : { name: trimmed(state.name), namespace: trimmed(state.namespace) };
  const spec: Record<string, any> = copy.spec ?? {};
  put(spec, 'version', trimmed(state.version));
  put(spec, 'deletionPolicy', state.deletionPolicy);
  if (!base) put(spec, 'target', { type: 'vcluster' });

  const platform: Record<string, any> = { ...(spec.platform ?? {}) };
  put(platform, 'networkPolicyEngine', state.networkPolicyEngine);
  const gateway: Record<string, any> = { ...(platform.gateway ?? {}) };
  put(
    gateway,
    'httpNodePort',
    state.httpNodePort.trim() === '' ? undefined : numberOrText(state.httpNodePort)
  );
  put(gateway, 'httpEndpoint', trimmed(state.httpEndpoint));
  put(platform, 'gateway', gateway);
  put(
    platform,
    'egressAllowedDestinations',
    state.egressAllowedDestinations.split(/[\n,]/).map(trimmed).filter(Boolean)
  );
  put(
    platform,
    'tenants',
    state.tenants.map(name => ({ name: trimmed(name) }))
  );
  put(
    platform,
    'users',
    state.users.map(u => {
      const user: Record<string, any> = { name: trimmed(u.name) };
      put(
        user,
        'memberships',
        u.memberships.map(m => ({ tenant: trimmed(m.tenant), role: trimmed(m.role) }))
      );
      return user;
    })
  );
  if (state.tenantAuthEnabled) {
    const auth: Record<string, any> = { ...(platform.tenantAuth ?? {}) };
    put(auth, 'issuer', trimmed(state.issuer));
    put(auth, 'clientId', trimmed(state.clientId));
    const ref: Record<string, any> = {};
    put(ref, 'name', state.clientSecretName);
    put(ref, 'key', state.clientSecretKey);
    put(auth, 'clientSecretRef', ref);
    put(auth, 'image', trimmed(state.tenantAuthImage));
    put(
      auth,
      'registry',
      trimmed(state.registryComponent) ? { component: trimmed(state.registryComponent) } : undefined
    );
    // An enabled section with nothing filled in is still sent as {}, so the schema's required
    // fields are reported beside the empty fields instead of silently dropping the section.
    platform.tenantAuth = auth;
  } else {
    delete platform.tenantAuth;
  }
  put(platform, 'tenantHostImage', trimmed(state.tenantHostImage));
  put(platform, 'tenantHostImagePullPolicy', state.tenantHostImagePullPolicy);
  put(spec, 'platform', platform);

  return {
    ...copy,
    apiVersion: API_VERSION,
    kind: 'PlatformInstance',
    metadata,
    spec,
  } as KubePlatformInstance;
}

/** The object and its problems (against the stored object on edit). */
export function check(
  state: FormState,
  base?: KubePlatformInstance
): { object: KubePlatformInstance; errors: FieldError[] } {
  const object = toInstance(state, base);
  return { object, errors: validateInstance(object, base) };
}

/** The field paths the form shows errors beside; anything else goes to the form's summary. */
export const FIELD_PATHS = {
  name: 'metadata.name',
  namespace: 'metadata.namespace',
  version: 'spec.version',
  deletionPolicy: 'spec.deletionPolicy',
  networkPolicyEngine: 'spec.platform.networkPolicyEngine',
  httpNodePort: 'spec.platform.gateway.httpNodePort',
  httpEndpoint: 'spec.platform.gateway.httpEndpoint',
  egressAllowedDestinations: 'spec.platform.egressAllowedDestinations',
  tenants: 'spec.platform.tenants',
  users: 'spec.platform.users',
  issuer: 'spec.platform.tenantAuth.issuer',
  clientId: 'spec.platform.tenantAuth.clientId',
  clientSecretName: 'spec.platform.tenantAuth.clientSecretRef.name',
  clientSecretKey: 'spec.platform.tenantAuth.clientSecretRef.key',
  clientSecretRef: 'spec.platform.tenantAuth.clientSecretRef',
  tenantAuthImage: 'spec.platform.tenantAuth.image',
  registryComponent: 'spec.platform.tenantAuth.registry.component',
  tenantHostImage: 'spec.platform.tenantHostImage',
  tenantHostImagePullPolicy: 'spec.platform.tenantHostImagePullPolicy',
} as const;

/** The messages for exactly `path`. */
export function messagesAt(errors: FieldError[], path: string): string[] {
  return errors.filter(e => e.path === path).map(e => e.message);
}

/** The errors that no field shows (by exact path or a list row under a shown list). */
export function unplaced(errors: FieldError[], shown: string[]): FieldError[] {
  return errors.filter(e => !shown.some(p => e.path === p || e.path.startsWith(`${p}[`)));
}
