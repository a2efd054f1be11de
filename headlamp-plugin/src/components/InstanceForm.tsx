// The Create and Edit dialog for a PlatformInstance: sections for general settings, gateway,
// tenants, users and their memberships, tenant auth (the client secret chosen from the
// namespace's Secrets and keys) and tenant hosts. Errors show beside their fields and block
// sending; Show YAML shows the exact object, Show patch the exact JSON Patch an edit sends.
import { ApiProxy, K8s } from '@kinvolk/headlamp-plugin/lib';
import { Dialog, SectionBox } from '@kinvolk/headlamp-plugin/lib/CommonComponents';
import {
  Alert,
  Box,
  Button,
  Checkbox,
  DialogActions,
  DialogContent,
  FormControlLabel,
  Grid,
  IconButton,
  MenuItem,
  TextField,
  Typography,
} from '@mui/material';
import React from 'react';
import YAML from 'yaml';
import {
  check,
  emptyForm,
  FIELD_PATHS,
  formFrom,
  FormState,
  messagesAt,
  unplaced,
  UserRow,
} from '../form';
import { CONFLICT_MESSAGE, editPatch, isConflict, PatchOp } from '../patch';
import { instancePath, KubePlatformInstance } from '../resource';
import { FieldError, specSchema } from '../validation';

/** The platform version a new instance starts with: the plugin's own, the platform release. */
export const DEFAULT_VERSION = '6.0.22';

const enumOf = (path: string[]): string[] => {
  let s: any = specSchema;
  for (const p of path) s = s?.properties?.[p];
  return (s?.enum as string[]) ?? [];
};

/** Sends the object (create) or the patch (edit) with the signed-in user's credentials. */
export async function send(
  mode: 'create' | 'edit',
  object: KubePlatformInstance,
  patch: PatchOp[]
): Promise<void> {
  const ns = object.metadata.namespace!;
  if (mode === 'create') {
    await ApiProxy.request(`${instancePath(ns)}?fieldValidation=Strict`, {
      method: 'POST',
      body: JSON.stringify(object),
      headers: { 'Content-Type': 'application/json' },
    });
  } else {
    const path = instancePath(ns, object.metadata.name);
    try {
      await ApiProxy.request(`${path}?fieldValidation=Strict`, {
        method: 'PATCH',
        body: JSON.stringify(patch),
        headers: { 'Content-Type': 'application/json-patch+json' },
      });
    } catch (err: any) {
      // The API server answers a failed `test` with 422 and a generic message; whether the
      // object moved on since the form opened is what tells a concurrent change apart.
      const opened = patch.find(op => op.op === 'test')?.value;
      if (err?.status === 409 || err?.status === 422) {
        const now = await ApiProxy.request(path).catch(() => null);
        if (now && now.metadata?.resourceVersion !== opened) {
          throw Object.assign(err, { conflict: true });
        }
      }
      throw err;
    }
  }
}

/** The text shown for a failed request: the conflict sentence, or the API server's message. */
export function requestErrorText(err: any): string {
  if (isConflict(err)) return CONFLICT_MESSAGE;
  const status = err?.status ? ` (${err.status})` : '';
  return `The API server refused the request${status}: ${err?.message ?? String(err)}`;
}

/** The text fields of the form that sit in a grid cell of their own. */
type CellKey = {
  [K in keyof FormState & keyof typeof FIELD_PATHS]: FormState[K] extends string ? K : never;
}[keyof FormState & keyof typeof FIELD_PATHS];

interface FieldProps {
  label: string;
  path: string;
  value: string;
  onChange: (v: string) => void;
  errors: FieldError[];
  helper?: string;
  select?: string[];
  disabled?: boolean;
  multiline?: boolean;
  required?: boolean;
}

function Field(props: FieldProps) {
  const { label, path, value, onChange, errors, helper, select, disabled, multiline, required } =
    props;
  const messages = messagesAt(errors, path);
  return (
    <TextField
      label={label}
      value={value}
      onChange={e => onChange(e.target.value)}
      error={messages.length > 0}
      helperText={messages.length > 0 ? messages.join('; ') : helper}
      select={!!select}
      disabled={disabled}
      multiline={multiline}
      required={required}
      minRows={multiline ? 2 : undefined}
      fullWidth
      size="small"
      variant="outlined"
      margin="dense"
      inputProps={{ 'data-path': path }}
    >
      {select?.map(option => (
        <MenuItem key={option} value={option}>
          {option === '' ? '(not set)' : option}
        </MenuItem>
      ))}
    </TextField>
  );
}

function ListErrors({ errors, path }: { errors: FieldError[]; path: string }) {
  const own = errors.filter(e => e.path === path);
  if (own.length === 0) return null;
  return (
    <Alert severity="error" data-path={path} sx={{ my: 1 }}>
      {own.map(e => e.message).join('; ')}
    </Alert>
  );
}

/** The namespace's Secrets and their keys, for the client secret reference. */
function useSecretChoices(namespace: string): {
  names: string[];
  keysOf: (name: string) => string[];
  error: string | null;
} {
  const { items, error } = K8s.ResourceClasses.Secret.useList({
    namespace: namespace || undefined,
  });
  const names = (items ?? []).map((s: any) => s.metadata.name as string).sort();
  const keysOf = (name: string) => {
    const secret: any = (items ?? []).find((s: any) => s.metadata.name === name);
    return Object.keys(secret?.jsonData?.data ?? secret?.data ?? {}).sort();
  };
  return { names, keysOf, error: error ? String((error as any).message ?? error) : null };
}

export interface InstanceFormProps {
  /** `create` a new instance or `edit` the stored one. */
  mode: 'create' | 'edit';
  /** The stored object, as it was when the form opened (edit). */
  original?: KubePlatformInstance;
  /** The namespace a new instance goes to. */
  namespace?: string;
  /** Whether the dialog is open. */
  open: boolean;
  /** Closes the dialog. */
  onClose: () => void;
  /** Sends the request; the default uses the API server with the user's credentials. */
  submit?: typeof send;
}

/** The Create / Edit dialog. */
export function InstanceForm(props: InstanceFormProps) {
  const { mode, original, open, onClose, submit = send } = props;
  const [state, setState] = React.useState<FormState>(() =>
    original ? formFrom(original) : emptyForm(props.namespace ?? '', DEFAULT_VERSION)
  );
  const [view, setView] = React.useState<'form' | 'yaml' | 'patch'>('form');
  const [sending, setSending] = React.useState(false);
  const [requestError, setRequestError] = React.useState<string | null>(null);
  const [touched, setTouched] = React.useState(false);
  const secrets = useSecretChoices(state.namespace);

  const { object, errors } = check(state, original);
  const patch = mode === 'edit' ? editPatch(original, object) : [];
  const shownErrors = touched || mode === 'edit' ? errors : [];

  const set =
    <K extends keyof FormState>(key: K) =>
    (value: FormState[K]) => {
      setTouched(true);
      setState(s => ({ ...s, [key]: value }));
    };
  const setUsers = (users: UserRow[]) => set('users')(users);

  async function onSubmit() {
    setTouched(true);
    setRequestError(null);
    if (errors.length > 0) return;
    if (mode === 'edit' && patch.length === 0) {
      onClose();
      return;
    }
    setSending(true);
    try {
      await submit(mode, object, patch);
      onClose();
    } catch (err) {
      setRequestError(requestErrorText(err));
    } finally {
      setSending(false);
    }
  }

  /** One field of the form in a grid cell, bound to `state[key]` and its errors. */
  const cell = (key: CellKey, label: string, extra: Partial<FieldProps> = {}, xs = 6) => (
    <Grid item xs={xs}>
      <Field
        label={label}
        path={FIELD_PATHS[key]}
        value={state[key]}
        onChange={set(key)}
        errors={shownErrors}
        {...extra}
      />
    </Grid>
  );

  const shown = Object.values(FIELD_PATHS) as string[];
  const summary = unplaced(shownErrors, shown);
  const policies = enumOf(['deletionPolicy']);
  const engines = enumOf(['platform', 'networkPolicyEngine']);
  const pullPolicies = ['', ...enumOf(['platform', 'tenantHostImagePullPolicy'])];
  const title =
    mode === 'create'
      ? 'Create Platform Instance'
      : `Edit Platform Instance ${original?.metadata.namespace}/${original?.metadata.name}`;

  return (
    <Dialog open={open} onClose={onClose} maxWidth="md" fullWidth title={title} titleProps={{}}>
      <DialogContent>
        {requestError && (
          <Alert severity="error" role="alert" sx={{ mb: 2 }}>
            {requestError}
          </Alert>
        )}
        {view === 'yaml' && (
          <SectionBox title="YAML that will be sent">
            <pre aria-label="YAML that will be sent">{YAML.stringify(object)}</pre>
          </SectionBox>
        )}
        {view === 'patch' && (
          <SectionBox title="JSON Patch that will be sent">
            <pre aria-label="JSON Patch that will be sent">{JSON.stringify(patch, null, 2)}</pre>
          </SectionBox>
        )}
        {view === 'form' && (
          <Box>
            {summary.length > 0 && (
              <Alert severity="error" sx={{ mb: 2 }}>
                {summary.map(e => `${e.path}: ${e.message}`).join('; ')}
              </Alert>
            )}
            <SectionBox title="General">
              <Grid container spacing={2}>
                {cell('name', 'Name', { disabled: mode === 'edit', required: true })}
                {cell('namespace', 'Namespace', { disabled: mode === 'edit', required: true })}
                {cell('version', 'Version', {
                  helper: 'Exact @di-framework/platform version, such as 6.0.22',
                })}
                {cell('deletionPolicy', 'Deletion policy', {
                  select: policies,
                  helper: 'Retain keeps the data on delete; Delete removes it',
                })}
                {cell('networkPolicyEngine', 'NetworkPolicy engine', { select: engines })}
                {cell('egressAllowedDestinations', 'Egress allowed destinations', {
                  multiline: true,
                  helper: 'One per line: host, host:port or CIDR',
                })}
              </Grid>
            </SectionBox>

            <SectionBox title="Gateway">
              <Grid container spacing={2}>
                {cell('httpNodePort', 'HTTP NodePort', {
                  helper: '0 or empty keeps it inside; else 30000-32767',
                })}
                {cell('httpEndpoint', 'HTTP endpoint', {
                  helper: 'http:// or https:// URL, such as http://apps.example:30080',
                })}
              </Grid>
            </SectionBox>

            <SectionBox title="Tenants">
              <ListErrors errors={shownErrors} path={FIELD_PATHS.tenants} />
              {state.tenants.map((tenant, i) => (
                <Box key={i} display="flex" alignItems="center">
                  <Field
                    label={`Tenant ${i + 1}`}
                    path={`${FIELD_PATHS.tenants}[${i}].name`}
                    value={tenant}
                    onChange={v => set('tenants')(state.tenants.map((t, j) => (j === i ? v : t)))}
                    errors={shownErrors}
                  />
                  <IconButton
                    aria-label={`Remove tenant ${i + 1}`}
                    onClick={() => set('tenants')(state.tenants.filter((_, j) => j !== i))}
                  >
                    ×
                  </IconButton>
                </Box>
              ))}
              <Button onClick={() => set('tenants')([...state.tenants, ''])}>Add tenant</Button>
            </SectionBox>

            <SectionBox title="Users">
              <ListErrors errors={shownErrors} path={FIELD_PATHS.users} />
              {state.users.map((user, i) => (
                <Box key={i} mb={2} pl={1} borderLeft={2} borderColor="divider">
                  <Box display="flex" alignItems="center">
                    <Field
                      label={`User ${i + 1}`}
                      path={`${FIELD_PATHS.users}[${i}].name`}
                      value={user.name}
                      onChange={v =>
                        setUsers(state.users.map((u, j) => (j === i ? { ...u, name: v } : u)))
                      }
                      errors={shownErrors}
                    />
                    <IconButton
                      aria-label={`Remove user ${i + 1}`}
                      onClick={() => setUsers(state.users.filter((_, j) => j !== i))}
                    >
                      ×
                    </IconButton>
                  </Box>
                  <ListErrors
                    errors={shownErrors}
                    path={`${FIELD_PATHS.users}[${i}].memberships`}
                  />
                  {user.memberships.map((m, k) => {
                    const update = (patchM: Partial<typeof m>) =>
                      setUsers(
                        state.users.map((u, j) =>
                          j === i
                            ? {
                                ...u,
                                memberships: u.memberships.map((x, l) =>
                                  l === k ? { ...x, ...patchM } : x
                                ),
                              }
                            : u
                        )
                      );
                    const base = `${FIELD_PATHS.users}[${i}].memberships[${k}]`;
                    const tenants = [...new Set([m.tenant, ...state.tenants.filter(Boolean)])];
                    return (
                      <Box key={k} display="flex" alignItems="center" gap={1} pl={2}>
                        <Field
                          label={`User ${i + 1} membership ${k + 1} tenant`}
                          path={`${base}.tenant`}
                          value={m.tenant}
                          onChange={v => update({ tenant: v })}
                          errors={shownErrors}
                          select={tenants}
                        />
                        <Field
                          label={`User ${i + 1} membership ${k + 1} role`}
                          path={`${base}.role`}
                          value={m.role}
                          onChange={v => update({ role: v })}
                          errors={shownErrors}
                        />
                        <IconButton
                          aria-label={`Remove user ${i + 1} membership ${k + 1}`}
                          onClick={() =>
                            setUsers(
                              state.users.map((u, j) =>
                                j === i
                                  ? { ...u, memberships: u.memberships.filter((_, l) => l !== k) }
                                  : u
                              )
                            )
                          }
                        >
                          ×
                        </IconButton>
                      </Box>
                    );
                  })}
                  <Button
                    onClick={() =>
                      setUsers(
                        state.users.map((u, j) =>
                          j === i
                            ? {
                                ...u,
                                memberships: [
                                  ...u.memberships,
                                  { tenant: state.tenants[0] ?? '', role: 'developer' },
                                ],
                              }
                            : u
                        )
                      )
                    }
                  >
                    Add membership to user {i + 1}
                  </Button>
                </Box>
              ))}
              <Button onClick={() => setUsers([...state.users, { name: '', memberships: [] }])}>
                Add user
              </Button>
            </SectionBox>

            <SectionBox title="Tenant auth">
              <FormControlLabel
                control={
                  <Checkbox
                    checked={state.tenantAuthEnabled}
                    onChange={e => set('tenantAuthEnabled')(e.target.checked)}
                  />
                }
                label="Tenant console login (OAuth)"
              />
              {state.tenantAuthEnabled && (
                <Grid container spacing={2}>
                  {cell('issuer', 'Issuer', {
                    helper: 'https:// URL of the OpenID Connect issuer',
                  })}
                  {cell('clientId', 'Client ID')}
                  <Grid item xs={6}>
                    <Field
                      label="Client secret: Secret"
                      path={FIELD_PATHS.clientSecretName}
                      value={state.clientSecretName}
                      onChange={v => {
                        set('clientSecretName')(v);
                        set('clientSecretKey')('');
                      }}
                      errors={shownErrors}
                      select={secrets.error ? undefined : ['', ...secrets.names]}
                      helper={
                        secrets.error
                          ? `Secrets of ${state.namespace} cannot be listed (${secrets.error}): type the name`
                          : `A Secret in ${state.namespace || 'the namespace'}`
                      }
                    />
                  </Grid>
                  <Grid item xs={6}>
                    <Field
                      label="Client secret: key"
                      path={FIELD_PATHS.clientSecretKey}
                      value={state.clientSecretKey}
                      onChange={set('clientSecretKey')}
                      errors={shownErrors}
                      select={
                        secrets.error || !state.clientSecretName
                          ? undefined
                          : ['', ...secrets.keysOf(state.clientSecretName)]
                      }
                    />
                  </Grid>
                  {cell('tenantAuthImage', 'Tenant auth image', {
                    helper: '<repository>@sha256:<64 hex>',
                  })}
                  {cell('registryComponent', 'Registry component image', {
                    helper: 'Optional; <repository>@sha256:<64 hex>',
                  })}
                </Grid>
              )}
              <ListErrors errors={shownErrors} path={FIELD_PATHS.clientSecretRef} />
            </SectionBox>

            <SectionBox title="Tenant hosts">
              <Grid container spacing={2}>
                {cell(
                  'tenantHostImage',
                  'Tenant host image',
                  { helper: 'Optional; <repository>@sha256:<64 hex>' },
                  8
                )}
                {cell(
                  'tenantHostImagePullPolicy',
                  'Tenant host pull policy',
                  { select: pullPolicies },
                  4
                )}
              </Grid>
            </SectionBox>
          </Box>
        )}
        {shownErrors.length > 0 && (
          <Typography color="error" variant="body2" role="status">
            {shownErrors.length === 1 ? '1 field needs' : `${shownErrors.length} fields need`} a fix
            before sending.
          </Typography>
        )}
      </DialogContent>
      <DialogActions>
        <Button onClick={() => setView(view === 'yaml' ? 'form' : 'yaml')}>
          {view === 'yaml' ? 'Back to form' : 'Show YAML'}
        </Button>
        {mode === 'edit' && (
          <Button onClick={() => setView(view === 'patch' ? 'form' : 'patch')}>
            {view === 'patch' ? 'Back to form' : 'Show patch'}
          </Button>
        )}
        <Button onClick={onClose}>Cancel</Button>
        <Button
          variant="contained"
          onClick={onSubmit}
          disabled={sending || (touched && errors.length > 0)}
        >
          {mode === 'create' ? 'Create' : 'Save'}
        </Button>
      </DialogActions>
    </Dialog>
  );
}
