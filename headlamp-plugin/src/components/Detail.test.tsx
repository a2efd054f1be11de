// The detail view's sections that say what the controller does next, rendered with Headlamp's
// components from status objects as the controller writes them.
import { fireEvent, screen, waitFor } from '@testing-library/react';
import { KubePlatformInstance, PlatformInstance } from '../resource';
import { renderInHeadlamp } from '../testing';
import { ActivitySection, HistorySection } from './Detail';

vi.setConfig({ testTimeout: 60_000 });

function instance(spec: object, status: object): PlatformInstance {
  const json: KubePlatformInstance = {
    apiVersion: 'platform.di-framework.dev/v1alpha1',
    kind: 'PlatformInstance',
    metadata: { name: 'one', namespace: 'team-a', uid: 'u-1', creationTimestamp: '' },
    spec: { version: '6.0.22', ...spec },
    status,
  } as any;
  return new PlatformInstance(json);
}

describe('ActivitySection', () => {
  it('shows the upgrade waiting for approval, and Approve sets the annotation to its version', async () => {
    const approve = vi.fn().mockResolvedValue(undefined);
    const pendingUpgrade = {
      version: '6.0.22',
      create: 0,
      update: 1,
      delete: 0,
      resources: ['update kubernetes:core/v1:ConfigMap platform-settings'],
      previewedAt: '2026-12-01T00:00:00Z',
    };
    renderInHeadlamp(
      <ActivitySection
        item={instance({ upgrade: { approval: 'Manual' } }, { pendingUpgrade })}
        approve={approve}
      />
    );
    expect(
      screen.getByText(/6\.0\.22 would create 0, update 1 and delete 0 resources/)
    ).toBeTruthy();
    expect(screen.getByText(/ConfigMap platform-settings/)).toBeTruthy();
    fireEvent.click(screen.getByRole('button', { name: 'Approve' }));
    await waitFor(() => expect(approve).toHaveBeenCalledTimes(1));
    expect(approve.mock.calls[0]).toEqual([
      'team-a',
      'one',
      { metadata: { annotations: { 'platform.di-framework.dev/approve': '6.0.22' } } },
    ]);
  });

  it('shows no pending upgrade and no Approve when none waits', () => {
    renderInHeadlamp(<ActivitySection item={instance({}, {})} approve={vi.fn()} />);
    expect(screen.queryByRole('button', { name: 'Approve' })).toBeNull();
  });

  it('shows a suspended instance and what is held', () => {
    const held =
      'spec.suspend is true: no install, upgrade, repair or Helm run starts (one already running finishes); set it to false to resume';
    renderInHeadlamp(
      <ActivitySection
        item={instance(
          { suspend: true },
          {
            conditions: [
              {
                type: 'Suspended',
                status: 'True',
                reason: 'Suspended',
                message: held,
                lastTransitionTime: '2026-12-01T00:00:00Z',
              },
            ],
          }
        )}
      />
    );
    expect(screen.getByText(held)).toBeTruthy();
  });

  it('shows the drift a Warn repair preview found', () => {
    const found =
      'the repair preview found drift: putting it back would create 1, update 0 and delete 0 resources (create kubernetes:core/v1:ConfigMap platform-settings); spec.repair.mode is Warn: nothing is changed';
    renderInHeadlamp(
      <ActivitySection
        item={instance(
          { repair: { mode: 'Warn' } },
          {
            conditions: [
              {
                type: 'DriftDetected',
                status: 'True',
                reason: 'DriftDetected',
                message: found,
                lastTransitionTime: '2026-12-01T00:00:00Z',
              },
            ],
          }
        )}
      />
    );
    expect(screen.getByText('Warn')).toBeTruthy();
    expect(screen.getByRole('alert').textContent).toBe(found);
  });

  it('shows when a failed run is tried again, and when it is not', () => {
    renderInHeadlamp(
      <ActivitySection item={instance({}, { failures: 1, nextRetryAt: '2026-12-01T00:00:10Z' })} />
    );
    expect(screen.getByText('1 failure in a row; next try at 2026-12-01T00:00:10Z')).toBeTruthy();
  });

  it('shows an instance that stopped retrying', () => {
    const stalled = {
      type: 'Stalled',
      status: 'True',
      reason: 'RetriesExhausted',
      message: 'helm failed',
      lastTransitionTime: '2026-12-01T00:00:00Z',
    };
    renderInHeadlamp(
      <ActivitySection item={instance({}, { failures: 5, conditions: [stalled] })} />
    );
    expect(
      screen.getByText(
        '5 failures in a row; no more tries until the spec changes or a retry is asked for'
      )
    ).toBeTruthy();
  });

  it('shows an instance that is not suspended', () => {
    renderInHeadlamp(<ActivitySection item={instance({}, {})} />);
    expect(screen.getByText('no')).toBeTruthy();
  });
});

describe('HistorySection', () => {
  it('shows the runs newest first, with what each applied', () => {
    const run = (kind: string, result: string, finishedAt: string, summary?: object) => ({
      kind,
      version: '6.0.22',
      result,
      startedAt: '2026-12-01T00:00:00Z',
      finishedAt,
      configHash: `sha256:${kind}`,
      summary,
    });
    renderInHeadlamp(
      <HistorySection
        item={instance(
          {},
          {
            history: [
              run('Repair', 'Failed', '2026-12-01T02:00:00Z'),
              run('Install', 'Succeeded', '2026-12-01T01:00:00Z', { created: 7 }),
            ],
          }
        )}
      />
    );
    const rows = screen.getAllByRole('row').map(r => r.textContent ?? '');
    const repair = rows.findIndex(r => r.includes('Repair'));
    const install = rows.findIndex(r => r.includes('Install'));
    expect(repair).toBeGreaterThan(0);
    expect(install).toBeGreaterThan(repair);
    expect(rows[install]).toContain('7 created, 0 updated, 0 deleted, 0 unchanged');
    expect(rows[install]).toContain('sha256:Install');
    expect(rows[repair]).toContain('Failed');
  });

  it('says when nothing has run', () => {
    renderInHeadlamp(<HistorySection item={instance({}, {})} />);
    expect(screen.getByText('No install has finished yet.')).toBeTruthy();
  });
});
