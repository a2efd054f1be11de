// Builds the browser test's page (index.html + main.tsx) from Headlamp's compiled frontend in
// @kinvolk/headlamp-plugin's lib/, with the same Vite plugins Headlamp's plugin toolchain uses.
import react from '@vitejs/plugin-react';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vite';
import svgr from 'vite-plugin-svgr';

const here = path.dirname(fileURLToPath(import.meta.url));

export default defineConfig({
  root: here,
  base: '/',
  define: { global: 'globalThis' },
  // No node polyfills: they turn CommonJS modules such as react into mixed modules Rollup cannot
  // read; index.html gives the few `process` reads Headlamp's code makes an empty environment.
  plugins: [svgr(), react()],
  build: {
    outDir: process.env.HOST_OUT_DIR ?? path.join(here, '../../../dist-test-host'),
    emptyOutDir: true,
    chunkSizeWarningLimit: 100000,
    sourcemap: false,
    // Headlamp's app is large; the test page needs no minification.
    minify: false,
  },
  logLevel: 'warn',
});
