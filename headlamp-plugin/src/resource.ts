// The PlatformInstance custom resource (platform.di-framework.dev/v1alpha1) as a Headlamp
// KubeObject: its types, routes and API paths, and how the plugin reads its state.
import { K8s } from '@kinvolk/headlamp-plugin/lib';
import type { KubeObjectInterface } from '@kinvolk/headlamp-plugin/lib/k8s/cluster';
import crd from './generated/crd.json';

/** A condition as the controller writes it (`metav1.Condition`). */
export interface InstanceCondition {
  type: string;
  status: 'True' | 'False' | 'Unknown' | string;
  reason: string;
  message: string;
  lastTransitionTime: string;
  observedGeneration?: number;
}

/** A membership of a user in one tenant. */
export interface Membership {
  tenant: string;
  role: string;
}

/** `spec` of a PlatformInstance (see docs/reference.md). */
export interface InstanceSpec {
  version?: string;
  target?: { type?: string };
  deletionPolicy?: 'Retain' | 'Delete' | string;
  suspend?: boolean;
  repair?: { mode?: 'Repair' | 'Warn' | 'Off' | string };
  upgrade?: { approval?: 'Automatic' | 'Manual' | string };
  platform?: {
    networkPolicyEngine?: string;
    gateway?: { httpNodePort?: number; httpEndpoint?: string };
    egressAllowedDestinations?: string[];
    tenants?: { name: string }[];
    users?: { name: string; memberships?: Membership[] }[];
    tenantAuth?: {
      issuer?: string;
      clientId?: string;
      clientSecretRef?: { name?: string; key?: string };
      image?: string;
      registry?: { component?: string };
    };
    tenantHostImage?: string;
    tenantHostImagePullPolicy?: string;
  };
}

/** `status` of a PlatformInstance, written by the controller only. */
export interface InstanceStatus {
  phase?: string;
  observedGeneration?: number;
  version?: string;
  installedVersion?: string;
  hostNamespace?: string;
  kubeconfigSecretRef?: { name: string; key: string };
  endpoints?: { http?: string; routeUrlPattern?: string };
  acknowledgedRetry?: string;
  failures?: number;
  nextRetryAt?: string;
  pendingUpgrade?: {
    version: string;
    create: number;
    update: number;
    delete: number;
    resources?: string[];
    error?: string;
    previewedAt?: string;
  };
  stateBackups?: { path: string; version: string; upgradeTo: string; takenAt: string }[];
  conditions?: InstanceCondition[];
  history?: {
    kind: string;
    version: string;
    result: string;
    startedAt: string;
    finishedAt?: string;
    configHash?: string;
    summary?: { created?: number; updated?: number; deleted?: number; unchanged?: number };
  }[];
  lastInstall?: {
    result: string;
    version: string;
    startedAt: string;
    finishedAt?: string;
    message?: string;
    summary?: {
      created?: number;
      updated?: number;
      deleted?: number;
      unchanged?: number;
      configHash?: string;
    };
  };
}

/** The JSON of a PlatformInstance. */
export interface KubePlatformInstance extends KubeObjectInterface {
  spec: InstanceSpec;
  status?: InstanceStatus;
}

/** The API group and version, from the CRD. */
export const API_VERSION = `${crd.group}/${crd.version}`;

/** Where the plugin's views live in Headlamp. */
export const ROUTES = {
  list: '/platform-instances',
  details: '/platform-instances/:namespace/:name',
};

/** The names the views are registered under (Headlamp links to routes by name). */
export const ROUTE_NAMES = {
  list: 'platform-instances',
  details: 'platform-instance',
};

// Headlamp's KubeObject, from the library Headlamp hands its plugins (the same path in the
// bundle, where it is pluginLib.K8s, and in the component tests).
const { KubeObject } = K8s.cluster;

/** A PlatformInstance, as Headlamp's resource views and hooks use it. */
export class PlatformInstance extends KubeObject<KubePlatformInstance> {
  static kind = crd.kind;
  static apiName = crd.plural;
  static apiVersion = API_VERSION;
  static isNamespaced = true;

  static get detailsRoute() {
    return ROUTE_NAMES.details;
  }

  static get listRoute() {
    return ROUTE_NAMES.list;
  }

  get spec(): InstanceSpec {
    return this.jsonData.spec ?? {};
  }

  get status(): InstanceStatus {
    return this.jsonData.status ?? {};
  }

  /** The phase, `Pending` before the controller has written one. */
  get phase(): string {
    return this.status.phase ?? 'Pending';
  }

  /** The `Ready` condition's status (`True`, `False`, `Unknown`), `Unknown` when absent. */
  get ready(): string {
    return this.status.conditions?.find(c => c.type === 'Ready')?.status ?? 'Unknown';
  }

  /** `spec.suspend`: installs, upgrades, repairs and Helm runs are held. */
  get suspended(): boolean {
    return this.spec.suspend === true;
  }

  /** What the deletion policy does, in a user's words. */
  get deletionPolicy(): 'Retain' | 'Delete' {
    return this.spec.deletionPolicy === 'Delete' ? 'Delete' : 'Retain';
  }
}

/** The API path of the instances of a namespace, or of one instance. */
/** The annotation that approves the upgrade to the version it holds (`approval: Manual`). */
export const APPROVE_ANNOTATION = 'platform.di-framework.dev/approve';

/** The merge patch that approves the upgrade to `version`. */
export function approvePatch(version: string) {
  return { metadata: { annotations: { [APPROVE_ANNOTATION]: version } } };
}

export function instancePath(namespace: string, name?: string): string {
  const base = `/apis/${API_VERSION}/namespaces/${encodeURIComponent(namespace)}/${crd.plural}`;
  return name ? `${base}/${encodeURIComponent(name)}` : base;
}

/**
 * When the failed run is tried again: "3 failures in a row; next try at <time>", "... no more
 * tries (Stalled: <message>)" once the controller stopped at --max-retries, or "" with none.
 */
export function retryText(status: InstanceStatus | undefined): string {
  const failures = status?.failures ?? 0;
  if (failures === 0) return '';
  const runs = `${failures} failure${failures === 1 ? '' : 's'} in a row`;
  if (status?.nextRetryAt) return `${runs}; next try at ${status.nextRetryAt}`;
  const stalled = status?.conditions?.find(
    c => c.type === 'Stalled' && c.status === 'True' && c.reason === 'RetriesExhausted'
  );
  if (stalled) return `${runs}; no more tries until the spec changes or a retry is asked for`;
  return `${runs}; retrying now`;
}

/** "6.0.22", or "6.0.22 (installed 6.0.21)" while an upgrade to spec.version is in progress. */
export function versionText(spec: InstanceSpec | undefined, status: InstanceStatus | undefined) {
  const wanted = spec?.version ?? status?.version ?? '';
  const installed = status?.installedVersion;
  if (installed && wanted && installed !== wanted) return `${wanted} (installed ${installed})`;
  return wanted || installed || '';
}

/** What deleting an instance does to its data under each policy. */
export function deletionPolicyText(policy: 'Retain' | 'Delete'): string {
  return policy === 'Delete'
    ? 'deletionPolicy is Delete: the instance’s vCluster data and Pulumi state are removed (a storage cleanup Job runs). This cannot be undone.'
    : 'deletionPolicy is Retain: the instance’s vCluster data and Pulumi state are kept, so nothing is lost; an operator can remove them later.';
}
