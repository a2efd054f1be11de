// The Create and Edit form rendered with Headlamp's components: errors beside their fields block
// sending, Show YAML shows the exact object, Show patch the exact JSON Patch, a valid create sends
// that object, an edit sends only the changes guarded by the resourceVersion test, and a refused
// test (a concurrent change) is told as such while other API errors show their message.
import { fireEvent, screen, waitFor } from '@testing-library/react';
import YAML from 'yaml';
import { CONFLICT_MESSAGE } from '../patch';
import { KubePlatformInstance } from '../resource';
import { renderInHeadlamp } from '../testing';
import { InstanceForm } from './InstanceForm';

const stored: KubePlatformInstance = {
  apiVersion: 'platform.di-framework.dev/v1alpha1',
  kind: 'PlatformInstance',
  metadata: { name: 'one', namespace: 'team-a', resourceVersion: '42' },
  spec: {
    version: '6.0.21',
    target: { type: 'vcluster' },
    deletionPolicy: 'Retain',
    platform: { networkPolicyEngine: 'existing', gateway: { httpNodePort: 30080 } },
  },
} as any;

/** The input labelled exactly `label` (a required field's label ends with " *"). */
function input(label: string): HTMLElement {
  const escaped = label.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  return screen.getByLabelText(new RegExp(`^${escaped}( \\*)?$`));
}

function type(label: string, value: string) {
  fireEvent.change(input(label), { target: { value } });
}

function helperOf(label: string): string {
  const field = input(label);
  const id = field.getAttribute('aria-describedby');
  return id ? document.getElementById(id)?.textContent ?? '' : '';
}

// Rendering Headlamp's dialogs in jsdom takes seconds on a shared CI machine.
vi.setConfig({ testTimeout: 60_000 });

describe('InstanceForm', () => {
  it('creates: shows errors beside fields, blocks sending, then sends the exact object', async () => {
    const submit = vi.fn().mockResolvedValue(undefined);
    const onClose = vi.fn();
    renderInHeadlamp(
      <InstanceForm mode="create" namespace="team-a" open onClose={onClose} submit={submit} />
    );
    type('Name', 'one');
    type('Version', '^6.0.0');
    type('HTTP NodePort', '80');
    expect(helperOf('Version')).toContain('must be an exact version');
    expect(helperOf('HTTP NodePort')).toContain('30000-32767');
    const create = screen.getByRole('button', { name: 'Create' });
    expect((create as HTMLButtonElement).disabled).toBe(true);
    fireEvent.click(create);
    expect(submit).not.toHaveBeenCalled();

    type('Version', '6.0.22');
    type('HTTP NodePort', '30080');
    type('HTTP endpoint', 'http://apps.example:30080');
    expect(helperOf('Version')).not.toContain('must be');
    fireEvent.click(screen.getByRole('button', { name: 'Show YAML' }));
    const yaml = YAML.parse(screen.getByLabelText('YAML that will be sent').textContent!);
    const expected = {
      apiVersion: 'platform.di-framework.dev/v1alpha1',
      kind: 'PlatformInstance',
      metadata: { name: 'one', namespace: 'team-a' },
      spec: {
        version: '6.0.22',
        deletionPolicy: 'Retain',
        target: { type: 'vcluster' },
        platform: {
          networkPolicyEngine: 'existing',
          gateway: { httpNodePort: 30080, httpEndpoint: 'http://apps.example:30080' },
        },
      },
    };
    expect(yaml).toEqual(expected);
    fireEvent.click(screen.getByRole('button', { name: 'Create' }));
    await waitFor(() => expect(submit).toHaveBeenCalledTimes(1));
    expect(submit.mock.calls[0][0]).toBe('create');
    expect(submit.mock.calls[0][1]).toEqual(expected);
    await waitFor(() => expect(onClose).toHaveBeenCalled());
  });

  it('checks tenants and memberships before sending', () => {
    renderInHeadlamp(<InstanceForm mode="create" namespace="team-a" open onClose={() => {}} />);
    type('Name', 'one');
    fireEvent.click(screen.getByRole('button', { name: 'Add tenant' }));
    fireEvent.click(screen.getByRole('button', { name: 'Add tenant' }));
    type('Tenant 1', 'acme');
    type('Tenant 2', 'acme');
    expect(screen.getByText(/duplicate entries for key \[name="acme"\]/)).toBeTruthy();
    type('Tenant 2', 'Beta');
    expect(helperOf('Tenant 2')).toContain('should match');
    expect((screen.getByRole('button', { name: 'Create' }) as HTMLButtonElement).disabled).toBe(
      true
    );
  });

  it('edits: shows and sends only the changes, guarded by the resourceVersion test', async () => {
    const submit = vi.fn().mockResolvedValue(undefined);
    renderInHeadlamp(
      <InstanceForm mode="edit" original={stored} open onClose={() => {}} submit={submit} />
    );
    type('Version', '6.0.22');
    fireEvent.click(screen.getByRole('button', { name: 'Show patch' }));
    const shown = JSON.parse(screen.getByLabelText('JSON Patch that will be sent').textContent!);
    expect(shown).toEqual([
      { op: 'test', path: '/metadata/resourceVersion', value: '42' },
      { op: 'replace', path: '/spec/version', value: '6.0.22' },
    ]);
    fireEvent.click(screen.getByRole('button', { name: 'Save' }));
    await waitFor(() => expect(submit).toHaveBeenCalledTimes(1));
    expect(submit.mock.calls[0][0]).toBe('edit');
    expect(submit.mock.calls[0][2]).toEqual(shown);
  });

  it('tells a concurrent change apart and overwrites nothing', async () => {
    const refused = Object.assign(
      new Error(
        'Unprocessable Entity - the server rejected our request due to an error in our request'
      ),
      { status: 422 }
    );
    refused.message += ': testing value /metadata/resourceVersion failed: test failed';
    const submit = vi.fn().mockRejectedValue(refused);
    const onClose = vi.fn();
    renderInHeadlamp(
      <InstanceForm mode="edit" original={stored} open onClose={onClose} submit={submit} />
    );
    type('Version', '6.0.22');
    fireEvent.click(screen.getByRole('button', { name: 'Save' }));
    expect(await screen.findByText(CONFLICT_MESSAGE)).toBeTruthy();
    expect(submit).toHaveBeenCalledTimes(1);
    expect(onClose).not.toHaveBeenCalled();
  });

  it('shows any other API error with its message', async () => {
    const denied = Object.assign(new Error('Forbidden - platforminstances is forbidden'), {
      status: 403,
    });
    const submit = vi.fn().mockRejectedValue(denied);
    renderInHeadlamp(
      <InstanceForm mode="edit" original={stored} open onClose={() => {}} submit={submit} />
    );
    type('Version', '6.0.22');
    fireEvent.click(screen.getByRole('button', { name: 'Save' }));
    expect(
      await screen.findByText(
        /refused the request \(403\): Forbidden - platforminstances is forbidden/
      )
    ).toBeTruthy();
  });
});
