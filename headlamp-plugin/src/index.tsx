// The di-framework-platform Headlamp plugin: a "Platform Instances" sidebar entry, the list and
// detail views of PlatformInstance objects, and their Create, Edit and Delete actions. It talks
// only to the Kubernetes API, with the signed-in user's credentials.
import { registerRoute, registerSidebarEntry } from '@kinvolk/headlamp-plugin/lib';
import { PlatformInstanceDetail } from './components/Detail';
import { PlatformInstanceList } from './components/List';
import { ROUTE_NAMES, ROUTES } from './resource';

registerSidebarEntry({
  parent: null,
  name: ROUTE_NAMES.list,
  label: 'Platform Instances',
  url: ROUTES.list,
  icon: 'mdi:cube-outline',
});

registerRoute({
  path: ROUTES.list,
  sidebar: ROUTE_NAMES.list,
  name: ROUTE_NAMES.list,
  exact: true,
  component: () => <PlatformInstanceList />,
});

registerRoute({
  path: ROUTES.details,
  sidebar: ROUTE_NAMES.list,
  name: ROUTE_NAMES.details,
  exact: true,
  component: () => <PlatformInstanceDetail />,
});
