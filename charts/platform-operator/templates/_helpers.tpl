{{/*
Helpers shared by the parent chart and the named templates of its subcharts (controller,
webhook). Object names are fixed, not derived from the release name: the chart installs once per
cluster, and the binaries' defaults and the seed's documentation name these objects.
*/}}

{{/* The controller's ServiceAccount; the operator's user is system:serviceaccount:<ns>:platform-operator. */}}
{{- define "platform-operator.controllerServiceAccount" -}}platform-operator{{- end -}}
{{- define "platform-operator.installServiceAccount" -}}platform-operator-install{{- end -}}
{{- define "platform-operator.webhookServiceAccount" -}}platform-operator-webhook{{- end -}}
{{/* The webhook's Service; the webhook's --service-name default. */}}
{{- define "platform-operator.webhookService" -}}platform-operator-webhook{{- end -}}
{{/* Both webhook configurations; the webhook's --mutating/--validating-webhook-configuration defaults. */}}
{{- define "platform-operator.webhookConfiguration" -}}platform-operator{{- end -}}
{{- define "platform-operator.stateClaimDefault" -}}platform-operator-state{{- end -}}
{{- define "platform-operator.passphraseSecretDefault" -}}platform-operator-passphrase{{- end -}}

{{/* Mount paths inside the controller container; the controller's flag defaults. */}}
{{- define "platform-operator.stateDir" -}}/var/lib/platform-operator/state{{- end -}}
{{- define "platform-operator.passphraseDir" -}}/etc/platform-operator/passphrase{{- end -}}
{{/* HOME of the image (ENV HOME in the Dockerfile), kept on an emptyDir. */}}
{{- define "platform-operator.home" -}}/home/platform-operator{{- end -}}
{{/* The operations port of both binaries (/healthz, /readyz, /metrics). */}}
{{- define "platform-operator.opsPort" -}}8080{{- end -}}
{{/* The webhook's TLS admission port. */}}
{{- define "platform-operator.admissionPort" -}}9443{{- end -}}

{{- define "platform-operator.stateClaim" -}}
{{- .Values.state.existingClaim | default (include "platform-operator.stateClaimDefault" .) -}}
{{- end -}}

{{- define "platform-operator.passphraseSecret" -}}
{{- .Values.passphrase.existingSecret | default (include "platform-operator.passphraseSecretDefault" .) -}}
{{- end -}}

{{- define "platform-operator.cleanupNamespace" -}}
{{- .Values.cleanupNamespace | default .Release.Namespace -}}
{{- end -}}

{{- define "platform-operator.image" -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- end -}}

{{/* Labels of every object; call with (dict "root" $ "component" "controller"). */}}
{{- define "platform-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: platform-operator
{{ include "platform-operator.selectorLabels" . }}
{{- end -}}

{{- define "platform-operator.selectorLabels" -}}
app.kubernetes.io/name: platform-operator
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Pod Security "restricted": pod level. */}}
{{- define "platform-operator.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 1000
runAsGroup: 1000
fsGroup: 1000
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Pod Security "restricted": container level. */}}
{{- define "platform-operator.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 1000
runAsGroup: 1000
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Downward-API environment both binaries read (--namespace and, for the controller, --identity). */}}
{{- define "platform-operator.podEnv" -}}
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end -}}

{{/*
The NetworkPolicy of one pod, with networkPolicy.enabled: ingress only to the ports it serves.
The operations port (/metrics and the probes) admits networkPolicy.metricsFrom, anyone when that
is empty; the webhook's admission port admits anyone, since the API server's source address
cannot be selected. Egress is not restricted. Call with
(dict "root" $ "component" "webhook" "admission" true); it starts with `---` when it renders.
*/}}
{{- define "platform-operator.networkPolicy" -}}
{{- if .root.Values.networkPolicy.enabled }}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: platform-operator-{{ .component }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "platform-operator.labels" . | nindent 4 }}
spec:
  podSelector:
    matchLabels:
      {{- include "platform-operator.selectorLabels" . | nindent 6 }}
  policyTypes: [Ingress]
  ingress:
    {{- if .admission }}
    - ports:
        - port: {{ include "platform-operator.admissionPort" .root }}
          protocol: TCP
    {{- end }}
    - ports:
        - port: {{ include "platform-operator.opsPort" .root }}
          protocol: TCP
      {{- with .root.Values.networkPolicy.metricsFrom }}
      from:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end }}
{{- end -}}

{{/* Probes on the operations port (HTTPS with metrics.secure; the kubelet does not verify it). */}}
{{- define "platform-operator.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
    scheme: {{ include "platform-operator.opsScheme" . | upper }}
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
    scheme: {{ include "platform-operator.opsScheme" . | upper }}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 3
{{- end -}}

{{/*
Refuses extraArgs that repeat a flag the chart sets from a value; call with
(dict "args" <list> "reserved" <list> "key" "extraArgs").
*/}}
{{- define "platform-operator.checkExtraArgs" -}}
{{- range .args -}}
{{- $flag := regexFind "^--[a-z0-9-]+" (toString .) -}}
{{- if has $flag $.reserved -}}
{{- fail (printf "%s sets %s, which the chart sets itself: set its value instead (see docs/chart.md)" $.key $flag) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Rules across values, each failing with a one-line reason. */}}
{{- define "platform-operator.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElect) -}}
{{- fail (printf "replicaCount is %d: more than 1 replica requires leaderElect=true, or several controllers would reconcile the same instances" (int .Values.replicaCount)) -}}
{{- end -}}
{{- if and .Values.state.existingClaim (not .Values.passphrase.existingSecret) -}}
{{- fail "state.existingClaim requires passphrase.existingSecret: the chart can't know the passphrase of state in a claim it didn't create" -}}
{{- end -}}
{{- if and .Values.headlamp.enabled (not (hasKey .Subcharts "headlamp")) -}}
{{- fail "headlamp.enabled=true needs the Headlamp chart 0.46.0 vendored in this chart's charts/ folder (a release does it with charts/vendor-headlamp.sh); this build has none" -}}
{{- end -}}
{{- if and .Values.prometheus.serviceMonitor.enabled .Values.prometheus.podMonitor.enabled -}}
{{- fail "prometheus.serviceMonitor.enabled and prometheus.podMonitor.enabled are both true: Prometheus would scrape every pod twice; enable one" -}}
{{- end -}}
{{- if and .Values.metrics.certSecret (not .Values.metrics.secure) -}}
{{- fail "metrics.certSecret is set but metrics.secure is false: the certificate would not be used; set metrics.secure=true or leave metrics.certSecret empty" -}}
{{- end -}}
{{- range .Values.extraEnv -}}
{{- if has .name (list "POD_NAMESPACE" "POD_NAME" "NODE_NAME" "HOME" "TMPDIR") -}}
{{- fail (printf "extraEnv sets %s, which the chart sets itself; leave it out" .name) -}}
{{- end -}}
{{- end -}}
{{- $metricsFlags := list "--metrics-bind-address" "--metrics-secure" "--metrics-auth-cache-ttl" "--metrics-cert-dir" -}}
{{- include "platform-operator.checkExtraArgs" (dict "args" .Values.extraArgs "key" "extraArgs" "reserved" (concat (list "--leader-elect" "--storage-root-base" "--install-timeout" "--repair-interval" "--target-poll" "--max-concurrent-installs" "--max-retries" "--default-instance-resources" "--cleanup-namespace" "--cleanup-image" "--npm-registry" "--npm-registry-file" "--npm-allow-scripts" "--pulumi-sdk-version" "--pod-security-standard" "--install-image" "--install-state-claim" "--install-pod-resources" "--install-node" "--install-service-account" "--state-dir" "--passphrase-file" "--namespace") $metricsFlags)) -}}
{{- include "platform-operator.checkExtraArgs" (dict "args" .Values.webhook.extraArgs "key" "webhook.extraArgs" "reserved" (concat (list "--cert-lifetime" "--namespace" "--service-name" "--admission-bind-address" "--mutating-webhook-configuration" "--validating-webhook-configuration" "--tls-secret-name") $metricsFlags)) -}}
{{- end -}}


{{/* The operations port's scheme: https with metrics.secure, else http. */}}
{{- define "platform-operator.opsScheme" -}}
{{- if .Values.metrics.secure -}}https{{- else -}}http{{- end -}}
{{- end -}}

{{/* Where metrics.certSecret is mounted; --metrics-cert-dir. */}}
{{- define "platform-operator.metricsCertDir" -}}/etc/platform-operator/metrics-tls{{- end -}}

{{/* The operations-port flags both binaries get from metrics.*. */}}
{{- define "platform-operator.metricsArgs" -}}
- {{ printf "--metrics-secure=%v" .Values.metrics.secure | quote }}
- {{ printf "--metrics-auth-cache-ttl=%v" .Values.metrics.authCacheTTL | quote }}
{{- if and .Values.metrics.secure .Values.metrics.certSecret }}
- --metrics-cert-dir={{ include "platform-operator.metricsCertDir" . }}
{{- end }}
{{- end -}}

{{/* The volume of metrics.certSecret, if any; call inside a volumes list. */}}
{{- define "platform-operator.metricsCertVolume" -}}
{{- if and .Values.metrics.secure .Values.metrics.certSecret }}
- name: metrics-tls
  secret:
    secretName: {{ .Values.metrics.certSecret }}
    defaultMode: 0440
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
{{- end }}
{{- end -}}

{{- define "platform-operator.metricsCertMount" -}}
{{- if and .Values.metrics.secure .Values.metrics.certSecret }}
- name: metrics-tls
  mountPath: {{ include "platform-operator.metricsCertDir" . }}
  readOnly: true
{{- end }}
{{- end -}}

{{/*
prometheus.io/* annotations for a Prometheus that discovers pods by annotation, while no
ServiceMonitor or PodMonitor is enabled (as cert-manager's chart does).
*/}}
{{- define "platform-operator.scrapeAnnotations" -}}
{{- if and .Values.prometheus.scrapeAnnotations (not .Values.prometheus.serviceMonitor.enabled) (not .Values.prometheus.podMonitor.enabled) }}
annotations:
  prometheus.io/scrape: "true"
  prometheus.io/port: {{ include "platform-operator.opsPort" . | quote }}
  prometheus.io/path: /metrics
  prometheus.io/scheme: {{ include "platform-operator.opsScheme" . }}
{{- end }}
{{- end -}}

{{/*
How a ServiceMonitor or PodMonitor endpoint scrapes the secure port: HTTPS with Prometheus's own
ServiceAccount token (bind it to platform-operator-metrics-reader), verifying the certificate
against metrics.certSecret's ca.crt as <service>.<namespace>.svc when one is mounted, else
skipping verification of the self-issued one. Call with (dict "root" $ "component" "controller").
*/}}
{{- define "platform-operator.monitorAuth" -}}
{{- $v := .root.Values -}}
scheme: {{ include "platform-operator.opsScheme" .root }}
{{- if $v.metrics.secure }}
bearerTokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
tlsConfig:
  {{- if $v.metrics.certSecret }}
  ca:
    secret:
      name: {{ $v.metrics.certSecret }}
      key: ca.crt
  serverName: {{ ternary "platform-operator-controller-metrics" (include "platform-operator.webhookService" .root) (eq .component "controller") }}.{{ .root.Release.Namespace }}.svc
  {{- else }}
  insecureSkipVerify: true
  {{- end }}
{{- end }}
{{- end -}}
