// For component tests only (not part of the plugin bundle): renders a view inside the providers
// Headlamp's app gives plugins: its Redux store, React Query client, MUI theme and a router.
import { queryClient } from '@kinvolk/headlamp-plugin/lib/lib/queryClient';
import { createMuiTheme } from '@kinvolk/headlamp-plugin/lib/lib/themes';
import store from '@kinvolk/headlamp-plugin/lib/redux/stores/store';
import { ThemeProvider } from '@mui/material/styles';
import { QueryClientProvider } from '@tanstack/react-query';
import { render } from '@testing-library/react';
import React from 'react';
import { Provider } from 'react-redux';
import { MemoryRouter } from 'react-router-dom';

const theme = createMuiTheme({ name: 'light', base: 'light' } as any);

/** Renders `ui` as Headlamp would, at `path` of cluster `test`. */
export function renderInHeadlamp(ui: React.ReactElement, path = '/c/test/platform-instances') {
  return render(
    <Provider store={store}>
      <QueryClientProvider client={queryClient}>
        <ThemeProvider theme={theme}>
          <MemoryRouter initialEntries={[path]}>{ui}</MemoryRouter>
        </ThemeProvider>
      </QueryClientProvider>
    </Provider>
  );
}
