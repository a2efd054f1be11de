// The transformation behind src/generated/crd.json, without file access (the tests import it).
import YAML from 'yaml';

/** The generated document, as text, from the CRD's YAML text. */
export function crdSchemaJson(crdYaml) {
  const crd = YAML.parse(crdYaml);
  const version = crd.spec.versions.find(v => v.name === 'v1alpha1');
  if (!version) throw new Error('the CRD has no v1alpha1 version');
  const doc = {
    source: 'charts/platform-operator/crds/platforminstances.platform.di-framework.dev.yaml',
    group: crd.spec.group,
    version: version.name,
    kind: crd.spec.names.kind,
    plural: crd.spec.names.plural,
    printerColumns: version.additionalPrinterColumns,
    spec: version.schema.openAPIV3Schema.properties.spec,
  };
  return JSON.stringify(doc, null, 2) + '\n';
}
