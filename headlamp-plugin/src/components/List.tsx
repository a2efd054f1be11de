// The Platform Instances list: name, namespace, phase, version (with the installed version while
// an upgrade is in progress), Ready, Suspended and age; sortable, filtered by Headlamp's namespace
// selector, kept live by Headlamp's watch of the API.
import { ResourceListView } from '@kinvolk/headlamp-plugin/lib/CommonComponents';
import { Button } from '@mui/material';
import React from 'react';
import { PlatformInstance, versionText } from '../resource';
import { InstanceForm } from './InstanceForm';
import { PhaseLabel, ReadyLabel } from './labels';

/** The list view registered at /platform-instances. */
export function PlatformInstanceList() {
  const [creating, setCreating] = React.useState(false);
  return (
    <>
      <ResourceListView
        title="Platform Instances"
        resourceClass={PlatformInstance}
        id="di-framework-platform-instances"
        headerProps={{
          titleSideActions: [
            <Button key="create" variant="contained" onClick={() => setCreating(true)}>
              Create
            </Button>,
          ],
        }}
        columns={[
          'name',
          'namespace',
          {
            id: 'phase',
            label: 'Phase',
            getValue: (item: PlatformInstance) => item.phase,
            render: (item: PlatformInstance) => <PhaseLabel phase={item.phase} />,
          },
          {
            id: 'version',
            label: 'Version',
            getValue: (item: PlatformInstance) => versionText(item.spec, item.status),
          },
          {
            id: 'ready',
            label: 'Ready',
            getValue: (item: PlatformInstance) => item.ready,
            render: (item: PlatformInstance) => <ReadyLabel ready={item.ready} />,
          },
          {
            id: 'suspended',
            label: 'Suspended',
            getValue: (item: PlatformInstance) => (item.suspended ? 'yes' : ''),
          },
          'age',
        ]}
      />
      {creating && (
        <InstanceForm mode="create" open={creating} onClose={() => setCreating(false)} />
      )}
    </>
  );
}
