// Status labels for a phase and the Ready condition, in Headlamp's StatusLabel colours.
import { StatusLabel } from '@kinvolk/headlamp-plugin/lib/CommonComponents';

const PHASE_STATUS: Record<string, 'success' | 'warning' | 'error' | ''> = {
  Ready: 'success',
  Pending: '',
  Provisioning: 'warning',
  Installing: 'warning',
  Upgrading: 'warning',
  Deleting: 'warning',
  Failed: 'error',
};

/** The phase as a coloured label. */
export function PhaseLabel({ phase }: { phase: string }) {
  return <StatusLabel status={PHASE_STATUS[phase] ?? ''}>{phase}</StatusLabel>;
}

/** The Ready condition's status as a coloured label. */
export function ReadyLabel({ ready }: { ready: string }) {
  const status = ready === 'True' ? 'success' : ready === 'False' ? 'error' : '';
  return <StatusLabel status={status}>{ready}</StatusLabel>;
}
