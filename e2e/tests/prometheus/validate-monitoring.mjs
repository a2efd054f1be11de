// Validates the Prometheus Operator objects given as a JSON array on standard input
// (ServiceMonitor, PodMonitor, PrometheusRule) with @kubernetes-models/prometheus-operator, whose
// schemas are generated from the operator's own Go API types. Argument: the folder holding its
// node_modules. Prints one line per object and exits 1 when any is invalid or of another kind.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const models = join(process.argv[2], "node_modules/@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1");
const objects = JSON.parse(readFileSync(0, "utf8"));
let failed = false;
for (const object of objects) {
  const name = `${object.kind}/${object.metadata?.name}`;
  if (!["ServiceMonitor", "PodMonitor", "PrometheusRule"].includes(object.kind) || object.apiVersion !== "monitoring.coreos.com/v1") {
    console.log(`${name}: not a monitoring.coreos.com/v1 kind this checks`);
    failed = true;
    continue;
  }
  const module = await import(pathToFileURL(join(models, `${object.kind}.js`)).href);
  try {
    new module[object.kind](object).validate();
    console.log(`${name}: valid`);
  } catch (e) {
    console.log(`${name}: ${e.message}`);
    failed = true;
  }
}
process.exit(failed ? 1 : 0);
