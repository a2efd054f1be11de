// The browser test's page: Headlamp's own frontend components, shipped compiled in
// @kinvolk/headlamp-plugin's lib/, assembled as Headlamp's app assembles them: its Redux store,
// React Query client, theme, sidebar and route switcher, and its plugin loader (`Plugins`), which
// fetches /plugins and each plugin's main.js and package.json from the backend and runs them.
// The backend is the stand-in in ../standin-backend.mjs; the cluster list comes from its /config.
import '@kinvolk/headlamp-plugin/lib/plugin/index';
import SidebarModule from '@kinvolk/headlamp-plugin/lib/components/Sidebar';
import RouteSwitcher from '@kinvolk/headlamp-plugin/lib/components/App/RouteSwitcher';
import { queryClient } from '@kinvolk/headlamp-plugin/lib/lib/queryClient';
import { setStore } from '@kinvolk/headlamp-plugin/lib/lib/router/createRouteURL';
import { createMuiTheme } from '@kinvolk/headlamp-plugin/lib/lib/themes';
import Plugins from '@kinvolk/headlamp-plugin/lib/plugin/Plugins';
import { setConfig } from '@kinvolk/headlamp-plugin/lib/redux/configSlice';
import store from '@kinvolk/headlamp-plugin/lib/redux/stores/store';
import Box from '@mui/material/Box';
import CssBaseline from '@mui/material/CssBaseline';
import { ThemeProvider } from '@mui/material/styles';
import { QueryClientProvider } from '@tanstack/react-query';
import { SnackbarProvider } from 'notistack';
import React from 'react';
import { createRoot } from 'react-dom/client';
import { Provider } from 'react-redux';
import { BrowserRouter } from 'react-router-dom';

const Sidebar = (SidebarModule as any).default ?? SidebarModule;

async function main() {
  const config = await (await fetch('/config')).json();
  const clusters = Object.fromEntries(
    config.clusters.map((c: any) => [c.name, { ...c, auth_type: c.auth_type ?? '' }])
  );
  store.dispatch(setConfig({ clusters }));
  // As Headlamp's app does: links to routes (plugins' ones too) are resolved from the store.
  setStore(store);
  const theme = createMuiTheme({ name: 'light', base: 'light' } as any);
  createRoot(document.getElementById('root')!).render(
    <Provider store={store}>
      <QueryClientProvider client={queryClient}>
        <ThemeProvider theme={theme}>
          <CssBaseline />
          <SnackbarProvider>
            <BrowserRouter>
              <Plugins />
              <Box display="flex">
                <Sidebar />
                <Box component="main" flexGrow={1} p={2} minWidth={0}>
                  <RouteSwitcher requiresToken={() => false} />
                </Box>
              </Box>
            </BrowserRouter>
          </SnackbarProvider>
        </ThemeProvider>
      </QueryClientProvider>
    </Provider>
  );
}

main().catch(err => {
  document.body.textContent = `host failed to start: ${err}`;
});
