{{/*
The admission webhook's objects, rendered by the parent with its own context (see the controller
subchart for why): `include "platform-operator-webhook.manifests" .`. The webhook's own values
are the parent's `webhook.*`.

The webhook configurations carry no caBundle: the webhook applies it (server-side apply of that
field only, field manager platform-operator-webhook), so a `helm upgrade`, whose three-way merge
never names the field, leaves it in place.
*/}}

{{- define "platform-operator-webhook.manifests" -}}
{{- $sa := include "platform-operator.webhookServiceAccount" . -}}
{{- $labels := include "platform-operator.labels" (dict "root" . "component" "webhook") -}}
{{- $configuration := include "platform-operator.webhookConfiguration" . -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ $sa }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- $labels | nindent 4 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: platform-operator-webhook
  labels:
    {{- $labels | nindent 4 }}
# No Secret read here: a stolen webhook token reads no Secret outside the release namespace. The
# webhook checks a clientSecretRef only by asking the API server whether the requester may read it;
# whether the Secret exists the controller reports in a condition.
rules:
  # clientSecretRef: may the requester read that Secret?
  - apiGroups: [authorization.k8s.io]
    resources: [subjectaccessreviews]
    verbs: [create]
  # The NodePort index: every instance and Service, watched.
  - apiGroups: [platform.di-framework.dev]
    resources: [platforminstances]
    verbs: [list, watch]
  - apiGroups: [""]
    resources: [services]
    verbs: [list, watch]
  # The caBundle of this chart's two webhook configurations, and only those.
  - apiGroups: [admissionregistration.k8s.io]
    resources: [mutatingwebhookconfigurations, validatingwebhookconfigurations]
    verbs: [get, list, watch, patch]
    resourceNames: [{{ $configuration }}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: platform-operator-webhook
  labels:
    {{- $labels | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: platform-operator-webhook
subjects:
  - kind: ServiceAccount
    name: {{ $sa }}
    namespace: {{ .Release.Namespace }}
---
# The certificate Secret, in the release namespace: created by the first replica, then read and
# updated by every replica. The only Secret the webhook can read.
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: platform-operator-webhook
  namespace: {{ .Release.Namespace }}
  labels:
    {{- $labels | nindent 4 }}
rules:
  - apiGroups: [""]
    resources: [secrets]
    verbs: [create]
  - apiGroups: [""]
    resources: [secrets]
    verbs: [get, update]
    resourceNames: [platform-operator-webhook-tls]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: platform-operator-webhook
  namespace: {{ .Release.Namespace }}
  labels:
    {{- $labels | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: platform-operator-webhook
subjects:
  - kind: ServiceAccount
    name: {{ $sa }}
    namespace: {{ .Release.Namespace }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ include "platform-operator.webhookService" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- $labels | nindent 4 }}
spec:
  type: ClusterIP
  selector:
    {{- include "platform-operator.selectorLabels" (dict "root" . "component" "webhook") | nindent 4 }}
  ports:
    - name: https
      port: 443
      targetPort: admission
      protocol: TCP
    - name: metrics
      port: {{ include "platform-operator.opsPort" . }}
      targetPort: metrics
      protocol: TCP
---
{{ include "platform-operator-webhook.deployment" . }}
---
{{ include "platform-operator-webhook.configurations" . }}
{{ include "platform-operator.networkPolicy" (dict "root" . "component" "webhook" "admission" true) }}
{{- end -}}

{{- define "platform-operator-webhook.deployment" -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: platform-operator-webhook
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "platform-operator.labels" (dict "root" . "component" "webhook") | nindent 4 }}
spec:
  replicas: {{ .Values.webhook.replicas }}
  selector:
    matchLabels:
      {{- include "platform-operator.selectorLabels" (dict "root" . "component" "webhook") | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "platform-operator.labels" (dict "root" . "component" "webhook") | nindent 8 }}
      {{- include "platform-operator.scrapeAnnotations" . | nindent 6 }}
    spec:
      serviceAccountName: {{ include "platform-operator.webhookServiceAccount" . }}
      automountServiceAccountToken: true
      securityContext:
        {{- include "platform-operator.podSecurityContext" . | nindent 8 }}
      # Long enough for in-flight reviews to finish (the webhook drains for up to 25 s).
      terminationGracePeriodSeconds: 30
      containers:
        - name: webhook
          image: {{ include "platform-operator.image" . }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          command: [/usr/local/bin/webhook]
          args:
            - {{ printf "--cert-lifetime=%v" .Values.webhook.certLifetime | quote }}
            - --service-name={{ include "platform-operator.webhookService" . }}
            - --mutating-webhook-configuration={{ include "platform-operator.webhookConfiguration" . }}
            - --validating-webhook-configuration={{ include "platform-operator.webhookConfiguration" . }}
            - --admission-bind-address=0.0.0.0:{{ include "platform-operator.admissionPort" . }}
            - --metrics-bind-address=0.0.0.0:{{ include "platform-operator.opsPort" . }}
            {{- include "platform-operator.metricsArgs" . | nindent 12 }}
            {{- range .Values.webhook.extraArgs }}
            - {{ . | quote }}
            {{- end }}
          env:
            {{- include "platform-operator.podEnv" . | nindent 12 }}
          ports:
            - name: admission
              containerPort: {{ include "platform-operator.admissionPort" . }}
              protocol: TCP
            - name: metrics
              containerPort: {{ include "platform-operator.opsPort" . }}
              protocol: TCP
          {{- include "platform-operator.probes" . | nindent 10 }}
          resources:
            {{- toYaml .Values.webhook.resources | nindent 12 }}
          securityContext:
            {{- include "platform-operator.containerSecurityContext" . | nindent 12 }}
          {{- if and .Values.metrics.secure .Values.metrics.certSecret }}
          volumeMounts:
            {{- include "platform-operator.metricsCertMount" . | nindent 12 }}
      volumes:
        {{- include "platform-operator.metricsCertVolume" . | nindent 8 }}
          {{- end }}
{{- end -}}

{{/* The rules, scope and conditions both webhooks share; call with (dict "root" $ "path" "/mutate"
"condition" (list name expression)), the condition saying when that webhook has work to do. */}}
{{- define "platform-operator-webhook.common" -}}
clientConfig:
  service:
    name: {{ include "platform-operator.webhookService" .root }}
    namespace: {{ .root.Release.Namespace }}
    path: {{ .path }}
    port: 443
rules:
  - apiGroups: [platform.di-framework.dev]
    apiVersions: [v1alpha1]
    operations: [CREATE, UPDATE]
    resources: [platforminstances]
    scope: Namespaced
# Instances being deleted never reach the webhook unless their version changes, so the
# controller's finalizer removal, and so deletion, never waits for the webhook.
matchConditions:
  - name: not-being-deleted-or-changing-version
    expression: "!has(object.metadata.deletionTimestamp) || has(object.spec.version) != has(oldObject.spec.version) || (has(object.spec.version) && object.spec.version != oldObject.spec.version)"
  # The API server calls the webhook only when it has work to do (docs/webhook.md#when-the-api-server-calls-the-webhooks).
  - name: {{ index .condition 0 }}
    expression: {{ index .condition 1 | quote }}
admissionReviewVersions: [v1]
sideEffects: None
matchPolicy: Equivalent
timeoutSeconds: {{ .root.Values.webhook.timeoutSeconds }}
{{- end -}}

{{- define "platform-operator-webhook.configurations" -}}
{{- $labels := include "platform-operator.labels" (dict "root" . "component" "webhook") -}}
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: {{ include "platform-operator.webhookConfiguration" . }}
  labels:
    {{- $labels | nindent 4 }}
webhooks:
  # Defaults only; when no replica answers, an instance without spec.version is admitted and the
  # controller reports it Stalled (InvalidSpec) until spec.version is set.
  - name: default.platform.di-framework.dev
    failurePolicy: Ignore
    reinvocationPolicy: Never
    {{- include "platform-operator-webhook.common" (dict "root" . "path" "/mutate" "condition" (list "spec-version-missing" "!has(object.spec) || !has(object.spec.version) || object.spec.version == null")) | nindent 4 }}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: {{ include "platform-operator.webhookConfiguration" . }}
  labels:
    {{- $labels | nindent 4 }}
webhooks:
  - name: validate.platform.di-framework.dev
    failurePolicy: {{ .Values.webhook.failurePolicy }}
    {{- include "platform-operator-webhook.common" (dict "root" . "path" "/validate" "condition" (list "create-or-spec-or-downgrade-annotation-changed" "oldObject == null || has(object.spec) != has(oldObject.spec) || (has(object.spec) && object.spec != oldObject.spec) || (has(object.metadata.annotations) && 'platform.di-framework.dev/allow-downgrade' in object.metadata.annotations ? object.metadata.annotations['platform.di-framework.dev/allow-downgrade'] : '') != (has(oldObject.metadata.annotations) && 'platform.di-framework.dev/allow-downgrade' in oldObject.metadata.annotations ? oldObject.metadata.annotations['platform.di-framework.dev/allow-downgrade'] : '')")) | nindent 4 }}
{{- end -}}
