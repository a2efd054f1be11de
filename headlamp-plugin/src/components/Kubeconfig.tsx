// The instance's kubeconfig: the Secret is read only when the user clicks Show or Download, with
// the user's own credentials, so RBAC on the Secret decides; a refusal is shown as such.
import { ApiProxy } from '@kinvolk/headlamp-plugin/lib';
import { NameValueTable, SectionBox } from '@kinvolk/headlamp-plugin/lib/CommonComponents';
import { Alert, Box, Button } from '@mui/material';
import React from 'react';
import { PlatformInstance } from '../resource';

/** The Secret and key holding the instance's kubeconfig (status, else the documented name). */
export function kubeconfigRef(item: PlatformInstance): { name: string; key: string } {
  return (
    item.status.kubeconfigSecretRef ?? { name: `${item.getName()}-kubeconfig`, key: 'kubeconfig' }
  );
}

/** Decodes base64 Secret data to text (UTF-8). */
export function decodeSecretValue(b64: string): string {
  const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  return new TextDecoder().decode(bytes);
}

/** The sentence shown when reading the Secret failed. */
export function secretErrorText(err: any, namespace: string, name: string): string {
  const message = err?.message ?? String(err);
  if (err?.status === 403) {
    return `Forbidden (403): you are not allowed to read Secret ${namespace}/${name}. ${message}`;
  }
  if (err?.status === 404) {
    return `Not found (404): Secret ${namespace}/${name} does not exist yet; it is written once the instance's vCluster serves.`;
  }
  return `Reading Secret ${namespace}/${name} failed${
    err?.status ? ` (${err.status})` : ''
  }: ${message}`;
}

/** Reads the kubeconfig with the signed-in user's credentials. */
async function readKubeconfig(item: PlatformInstance): Promise<string> {
  const ns = item.getNamespace()!;
  const { name, key } = kubeconfigRef(item);
  const secret = await ApiProxy.request(
    `/api/v1/namespaces/${encodeURIComponent(ns)}/secrets/${encodeURIComponent(name)}`
  );
  const value = secret?.data?.[key];
  if (!value) throw new Error(`Secret ${ns}/${name} has no key ${key}`);
  return decodeSecretValue(value);
}

/** The Kubeconfig section of the detail view. */
export function KubeconfigSection({ item }: { item: PlatformInstance }) {
  const [text, setText] = React.useState<string | null>(null);
  const [error, setError] = React.useState<string | null>(null);
  const [busy, setBusy] = React.useState(false);
  const ns = item.getNamespace()!;
  const { name, key } = kubeconfigRef(item);

  async function load(then: (text: string) => void) {
    setBusy(true);
    setError(null);
    try {
      then(await readKubeconfig(item));
    } catch (err) {
      setText(null);
      setError(secretErrorText(err, ns, name));
    } finally {
      setBusy(false);
    }
  }

  function download(content: string) {
    const url = URL.createObjectURL(new Blob([content], { type: 'application/yaml' }));
    const a = document.createElement('a');
    a.href = url;
    a.download = `${ns}-${item.getName()}.kubeconfig`;
    a.click();
    URL.revokeObjectURL(url);
  }

  return (
    <SectionBox title="Kubeconfig">
      <NameValueTable
        rows={[
          { name: 'Secret', value: `${ns}/${name}` },
          { name: 'Key', value: key },
        ]}
      />
      <Box my={1} display="flex" gap={1}>
        <Button
          variant="outlined"
          disabled={busy}
          onClick={() => (text ? setText(null) : load(setText))}
        >
          {text ? 'Hide' : 'Show'}
        </Button>
        <Button variant="outlined" disabled={busy} onClick={() => load(download)}>
          Download
        </Button>
      </Box>
      {error && (
        <Alert severity="error" role="alert">
          {error}
        </Alert>
      )}
      {text && <pre aria-label="Instance kubeconfig">{text}</pre>}
    </SectionBox>
  );
}
