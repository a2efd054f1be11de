#!/usr/bin/env node
// Writes src/generated/crd.json from the chart's PlatformInstance CRD: the v1alpha1
// openAPIV3Schema of `spec` (with every x-kubernetes-validations rule) and the printer columns.
// The plugin's client-side rules (src/validation.ts) interpret this file, so they follow the CRD.
// `--check` exits 1 when the committed file differs from what the CRD generates.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { crdSchemaJson } from './crd-schema.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
export const crdPath = path.resolve(
  here,
  '../../charts/platform-operator/crds/platforminstances.platform.di-framework.dev.yaml'
);
export const outPath = path.resolve(here, '../src/generated/crd.json');

/** The generated document, as text. */
export function generate() {
  return crdSchemaJson(fs.readFileSync(crdPath, 'utf8'));
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const text = generate();
  if (process.argv.includes('--check')) {
    const current = fs.existsSync(outPath) ? fs.readFileSync(outPath, 'utf8') : '';
    if (current !== text) {
      console.error(`${outPath} is stale: run npm run gen-schema`);
      process.exit(1);
    }
  } else {
    fs.writeFileSync(outPath, text);
    console.log(`wrote ${outPath}`);
  }
}
