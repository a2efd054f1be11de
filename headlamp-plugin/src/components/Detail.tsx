// The detail view of one instance: spec and status, whether it is suspended, when a failed
// run is retried, the drift the repair preview found and the upgrade waiting for approval
// (with Approve), what the last install applied and the history of runs, endpoints,
// conditions with reasons and messages, recent Events, the host namespace and the kubeconfig;
// Edit (the form, sending a JSON Patch) and Delete (saying what deletionPolicy will do).
import { ApiProxy } from '@kinvolk/headlamp-plugin/lib';
import {
  ConfirmDialog,
  DateLabel,
  DetailsGrid,
  Link,
  NameValueTable,
  SectionBox,
  SimpleTable,
  StatusLabel,
} from '@kinvolk/headlamp-plugin/lib/CommonComponents';
import { Alert, Button } from '@mui/material';
import React from 'react';
import { useHistory, useParams } from 'react-router-dom';
import {
  approvePatch,
  deletionPolicyText,
  InstanceCondition,
  instancePath,
  PlatformInstance,
  retryText,
  versionText,
} from '../resource';
import { InstanceForm, requestErrorText } from './InstanceForm';
import { KubeconfigSection } from './Kubeconfig';
import { PhaseLabel, ReadyLabel } from './labels';

function EditAction({ item }: { item: PlatformInstance }) {
  const [open, setOpen] = React.useState(false);
  // The form keeps the object as it was when opened: its resourceVersion guards the patch.
  const [snapshot, setSnapshot] = React.useState(item.jsonData);
  return (
    <>
      <Button
        onClick={() => {
          setSnapshot(JSON.parse(JSON.stringify(item.jsonData)));
          setOpen(true);
        }}
      >
        Edit
      </Button>
      {open && (
        <InstanceForm mode="edit" original={snapshot} open={open} onClose={() => setOpen(false)} />
      )}
    </>
  );
}

function DeleteAction({ item }: { item: PlatformInstance }) {
  const [open, setOpen] = React.useState(false);
  const [error, setError] = React.useState<string | null>(null);
  const history = useHistory();
  return (
    <>
      <Button color="error" onClick={() => setOpen(true)}>
        Delete
      </Button>
      <ConfirmDialog
        open={open}
        title={`Delete Platform Instance ${item.getNamespace()}/${item.getName()}?`}
        description={
          <>
            {deletionPolicyText(item.deletionPolicy)}
            {error && (
              <Alert severity="error" role="alert">
                {error}
              </Alert>
            )}
          </>
        }
        confirmLabel="Delete"
        handleClose={() => setOpen(false)}
        onConfirm={async () => {
          try {
            await item.delete();
            history.push(item.getListLink());
          } catch (err) {
            setError(requestErrorText(err));
            setOpen(true);
          }
        }}
      />
    </>
  );
}

function SpecSection({ item }: { item: PlatformInstance }) {
  const p = item.spec.platform ?? {};
  const auth = p.tenantAuth;
  return (
    <SectionBox title="Spec">
      <NameValueTable
        rows={[
          { name: 'Version', value: item.spec.version },
          { name: 'Target', value: item.spec.target?.type },
          { name: 'Deletion policy', value: item.deletionPolicy },
          { name: 'NetworkPolicy engine', value: p.networkPolicyEngine },
          { name: 'Gateway NodePort', value: String(p.gateway?.httpNodePort ?? 0) },
          {
            name: 'Gateway endpoint',
            value: p.gateway?.httpEndpoint,
            hide: !p.gateway?.httpEndpoint,
          },
          {
            name: 'Egress allowed',
            value: (p.egressAllowedDestinations ?? []).join(', '),
            hide: !p.egressAllowedDestinations?.length,
          },
          { name: 'Tenant auth issuer', value: auth?.issuer, hide: !auth },
          { name: 'Tenant auth client ID', value: auth?.clientId, hide: !auth },
          {
            name: 'Tenant auth client secret',
            value: auth ? `${auth.clientSecretRef?.name} / ${auth.clientSecretRef?.key}` : '',
            hide: !auth,
          },
          { name: 'Tenant auth image', value: auth?.image, hide: !auth },
          { name: 'Registry component', value: auth?.registry?.component, hide: !auth?.registry },
          { name: 'Tenant host image', value: p.tenantHostImage, hide: !p.tenantHostImage },
          {
            name: 'Tenant host pull policy',
            value: p.tenantHostImagePullPolicy,
            hide: !p.tenantHostImagePullPolicy,
          },
        ]}
      />
      <SimpleTable
        columns={[{ label: 'Tenant', getter: (t: { name: string }) => t.name }]}
        data={p.tenants ?? []}
        emptyMessage="No tenants"
      />
      <SimpleTable
        columns={[
          { label: 'User', getter: (u: any) => u.name },
          {
            label: 'Memberships',
            getter: (u: any) =>
              (u.memberships ?? []).map((m: any) => `${m.tenant} (${m.role})`).join(', '),
          },
        ]}
        data={p.users ?? []}
        emptyMessage="No users"
      />
    </SectionBox>
  );
}

function LastInstallSection({ item }: { item: PlatformInstance }) {
  const last = item.status.lastInstall;
  return (
    <SectionBox title="Last install">
      {last ? (
        <NameValueTable
          rows={[
            { name: 'Result', value: last.result },
            { name: 'Version', value: last.version },
            { name: 'Started', value: last.startedAt },
            { name: 'Finished', value: last.finishedAt ?? 'running' },
            { name: 'Message', value: last.message, hide: !last.message },
            {
              name: 'Resources',
              value: last.summary
                ? `${last.summary.created ?? 0} created, ${last.summary.updated ?? 0} updated, ${
                    last.summary.deleted ?? 0
                  } deleted, ${last.summary.unchanged ?? 0} unchanged`
                : '',
              hide: !last.summary,
            },
            {
              name: 'Config hash',
              value: last.summary?.configHash,
              hide: !last.summary?.configHash,
            },
          ]}
        />
      ) : (
        <Alert severity="info">No install has run yet.</Alert>
      )}
    </SectionBox>
  );
}

/** Sends the merge patch that sets the approve annotation, with the signed-in user's credentials. */
export async function sendApproval(namespace: string, name: string, patch: object) {
  await ApiProxy.request(instancePath(namespace, name), {
    method: 'PATCH',
    body: JSON.stringify(patch),
    headers: { 'Content-Type': 'application/merge-patch+json' },
  });
}

/** The upgrade waiting for approval: what its preview found, and Approve. */
function PendingUpgrade({
  item,
  approve,
}: {
  item: PlatformInstance;
  approve: typeof sendApproval;
}) {
  const pending = item.status.pendingUpgrade!;
  const [error, setError] = React.useState<string | null>(null);
  const found = pending.error
    ? `the preview failed: ${pending.error}`
    : `would create ${pending.create}, update ${pending.update} and delete ${pending.delete} resources` +
      (pending.resources?.length ? ` (${pending.resources.join(', ')})` : '');
  return (
    <Alert
      severity="info"
      action={
        <Button
          onClick={() =>
            approve(item.metadata.namespace!, item.metadata.name, approvePatch(pending.version))
              .then(() => setError(null))
              .catch(err => setError(requestErrorText(err)))
          }
        >
          Approve
        </Button>
      }
    >
      {`${pending.version} ${found}`}
      {error && <div role="alert">{error}</div>}
    </Alert>
  );
}

/**
 * What the controller will do next: whether the instance is suspended (and what is held), when
 * a failed run is tried again, and the upgrade waiting for approval.
 */
export function ActivitySection({
  item,
  approve = sendApproval,
}: {
  item: PlatformInstance;
  approve?: typeof sendApproval;
}) {
  const held = item.status.conditions?.find(c => c.type === 'Suspended' && c.status === 'True');
  const drift = item.status.conditions?.find(c => c.type === 'DriftDetected');
  const mode = item.spec.repair?.mode ?? 'Repair';
  return (
    <SectionBox title="Activity">
      <NameValueTable
        rows={[
          {
            name: 'Suspended',
            value: item.suspended
              ? held?.message ?? 'yes: spec.suspend is true (the controller has not seen it yet)'
              : 'no',
          },
          { name: 'Next retry', value: retryText(item.status), hide: !item.status.failures },
          { name: 'Repair mode', value: mode },
          {
            name: 'Pending upgrade',
            value: item.status.pendingUpgrade && <PendingUpgrade item={item} approve={approve} />,
            hide: !item.status.pendingUpgrade,
          },
          {
            name: 'Drift',
            value:
              drift?.status === 'True' ? (
                <Alert severity="warning">{drift.message}</Alert>
              ) : (
                drift?.message ??
                (mode === 'Off' ? 'not checked (repair mode Off)' : 'not checked yet')
              ),
          },
        ]}
      />
    </SectionBox>
  );
}

/** The last runs of the platform program, newest first (`status.history`). */
export function HistorySection({ item }: { item: PlatformInstance }) {
  type Run = NonNullable<PlatformInstance['status']['history']>[number];
  const counts = (s: Run['summary']) =>
    s
      ? `${s.created ?? 0} created, ${s.updated ?? 0} updated, ${s.deleted ?? 0} deleted, ${
          s.unchanged ?? 0
        } unchanged`
      : '';
  return (
    <SectionBox title="History">
      <SimpleTable
        columns={[
          { label: 'Kind', getter: (r: Run) => r.kind },
          { label: 'Version', getter: (r: Run) => r.version },
          { label: 'Result', getter: (r: Run) => r.result },
          { label: 'Started', getter: (r: Run) => r.startedAt },
          { label: 'Finished', getter: (r: Run) => r.finishedAt ?? '' },
          { label: 'Resources', getter: (r: Run) => counts(r.summary) },
          { label: 'Config hash', getter: (r: Run) => r.configHash ?? '' },
        ]}
        data={item.status.history ?? []}
        emptyMessage="No install has finished yet."
      />
    </SectionBox>
  );
}

/**
 * The conditions with their reasons and messages in plain sight (Headlamp's ConditionsTable
 * shows a message only on hover).
 */
function ConditionsSection({ item }: { item: PlatformInstance }) {
  return (
    <SectionBox title="Conditions">
      <SimpleTable
        columns={[
          {
            label: 'Condition',
            getter: (c: InstanceCondition) => (
              <StatusLabel
                status={c.status === 'True' ? (c.type === 'Stalled' ? 'error' : 'success') : ''}
              >
                {c.type}
              </StatusLabel>
            ),
          },
          { label: 'Status', getter: (c: InstanceCondition) => c.status },
          { label: 'Reason', getter: (c: InstanceCondition) => c.reason },
          { label: 'Message', getter: (c: InstanceCondition) => c.message },
          {
            label: 'Last transition',
            getter: (c: InstanceCondition) => <DateLabel date={c.lastTransitionTime} />,
          },
        ]}
        data={item.status.conditions ?? []}
        emptyMessage="No conditions yet: the controller has not reported on this instance."
      />
    </SectionBox>
  );
}

/** The detail view registered at /platform-instances/:namespace/:name. */
export function PlatformInstanceDetail() {
  const { namespace, name } = useParams<{ namespace: string; name: string }>();
  return (
    <DetailsGrid
      resourceType={PlatformInstance}
      name={name}
      namespace={namespace}
      withEvents
      noDefaultActions
      actions={(item: PlatformInstance | null) =>
        item
          ? [<EditAction key="edit" item={item} />, <DeleteAction key="delete" item={item} />]
          : []
      }
      extraInfo={(item: PlatformInstance | null) =>
        item
          ? [
              { name: 'Phase', value: <PhaseLabel phase={item.phase} /> },
              { name: 'Ready', value: <ReadyLabel ready={item.ready} /> },
              { name: 'Suspended', value: item.suspended ? 'yes' : 'no' },
              { name: 'Version', value: versionText(item.spec, item.status) },
              { name: 'Installed version', value: item.status.installedVersion ?? '' },
              {
                name: 'Host namespace',
                value: item.status.hostNamespace ? (
                  <Link routeName="namespace" params={{ name: item.status.hostNamespace }}>
                    {item.status.hostNamespace}
                  </Link>
                ) : (
                  'not created yet'
                ),
              },
              {
                name: 'Observed generation',
                value: `${item.status.observedGeneration ?? '-'} of ${item.metadata.generation}`,
              },
            ]
          : []
      }
      extraSections={(item: PlatformInstance | null) =>
        item
          ? [
              { id: 'di-framework.spec', section: <SpecSection item={item} /> },
              {
                id: 'di-framework.endpoints',
                section: (
                  <SectionBox title="Endpoints">
                    <NameValueTable
                      rows={[
                        { name: 'HTTP', value: item.status.endpoints?.http ?? 'none' },
                        {
                          name: 'Route URL pattern',
                          value: item.status.endpoints?.routeUrlPattern ?? 'none',
                        },
                      ]}
                    />
                  </SectionBox>
                ),
              },
              { id: 'di-framework.activity', section: <ActivitySection item={item} /> },
              { id: 'di-framework.last-install', section: <LastInstallSection item={item} /> },
              { id: 'di-framework.history', section: <HistorySection item={item} /> },
              {
                id: 'di-framework.conditions',
                section: <ConditionsSection item={item} />,
              },
              { id: 'di-framework.kubeconfig', section: <KubeconfigSection item={item} /> },
            ]
          : []
      }
    />
  );
}
