{{/*
The controller's objects. Helm gives a subchart no view of its parent's values, and the values
this chart documents are top-level (image.digest, replicaCount, leaderElect, ...), so the parent
renders these named templates with its own context: `include "platform-operator-controller.manifests" .`
*/}}

{{- define "platform-operator-controller.manifests" -}}
{{- $sa := include "platform-operator.controllerServiceAccount" . -}}
{{- $labels := include "platform-operator.labels" (dict "root" . "component" "controller") -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ $sa }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- $labels | nindent 4 }}
---
# The install pods' account: no permissions, and its token is never mounted.
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "platform-operator.installServiceAccount" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- $labels | nindent 4 }}
automountServiceAccountToken: false
---
{{ include "platform-operator-controller.clusterRole" . }}
---
{{- if .Values.rbac.clusterAdmin }}
# rbac.clusterAdmin=true: the vCluster chart creates RBAC, workloads and Services in each host
# namespace, and Kubernetes only lets Helm grant permissions it already holds.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: platform-operator-cluster-admin
  labels:
    {{- $labels | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: cluster-admin
subjects:
  - kind: ServiceAccount
    name: {{ $sa }}
    namespace: {{ .Release.Namespace }}
{{- else }}
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: platform-operator
  labels:
    {{- $labels | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: platform-operator
subjects:
  - kind: ServiceAccount
    name: {{ $sa }}
    namespace: {{ .Release.Namespace }}
---
# The leader Lease, in the operator's namespace only.
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: platform-operator
  namespace: {{ .Release.Namespace }}
  labels:
    {{- $labels | nindent 4 }}
rules:
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    verbs: [get, create, update]
  # The install Jobs: created, watched (by name) while they run, deleted (only the operator's,
  # by UID) when they end; their pods, logs and request Secrets are in the ClusterRole's rules.
  - apiGroups: [batch]
    resources: [jobs]
    verbs: [get, list, watch, create, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: platform-operator
  namespace: {{ .Release.Namespace }}
  labels:
    {{- $labels | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: platform-operator
subjects:
  - kind: ServiceAccount
    name: {{ $sa }}
    namespace: {{ .Release.Namespace }}
---
# The storage cleanup Jobs, in the cleanup namespace only: created, read, and deleted only when
# another instance (another UID) left one of the same name; their FailedCreate events are read
# with the ClusterRole's core events rule.
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: platform-operator-cleanup
  namespace: {{ include "platform-operator.cleanupNamespace" . }}
  labels:
    {{- $labels | nindent 4 }}
rules:
  - apiGroups: [batch]
    resources: [jobs]
    verbs: [get, create, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: platform-operator-cleanup
  namespace: {{ include "platform-operator.cleanupNamespace" . }}
  labels:
    {{- $labels | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: platform-operator-cleanup
subjects:
  - kind: ServiceAccount
    name: {{ $sa }}
    namespace: {{ .Release.Namespace }}
{{- end }}
---
apiVersion: v1
kind: Service
metadata:
  name: platform-operator-controller-metrics
  namespace: {{ .Release.Namespace }}
  labels:
    {{- $labels | nindent 4 }}
spec:
  type: ClusterIP
  selector:
    {{- include "platform-operator.selectorLabels" (dict "root" . "component" "controller") | nindent 4 }}
  ports:
    - name: metrics
      port: {{ include "platform-operator.opsPort" . }}
      targetPort: metrics
      protocol: TCP
---
{{ include "platform-operator-controller.deployment" . }}
{{ include "platform-operator.networkPolicy" (dict "root" . "component" "controller" "admission" false) }}
{{- end -}}

{{/*
The ClusterRole platform-operator: exactly what the controller calls, what Helm needs for the
vCluster release, and what the shipped vCluster chart's own Role grants (Kubernetes lets Helm
create that Role only if the operator holds every permission in it). Rendered whatever
rbac.clusterAdmin says, so the permissions are on record; bound only when it is false.
*/}}
{{- define "platform-operator-controller.clusterRole" -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: platform-operator
  labels:
    {{- include "platform-operator.labels" (dict "root" . "component" "controller") | nindent 4 }}
rules:
  # Instances: watched in every namespace; finalizer added and removed by merge patch; status.
  - apiGroups: [platform.di-framework.dev]
    resources: [platforminstances]
    verbs: [list, watch, patch]
  - apiGroups: [platform.di-framework.dev]
    resources: [platforminstances/status]
    verbs: [patch]
  # Host namespaces: applied, annotated, deleted; watched (by their host-namespace label) for the
  # controller's cache.
  - apiGroups: [""]
    resources: [namespaces]
    verbs: [get, list, watch, create, patch, delete]
  # Secrets: owned kubeconfig Secrets watched everywhere; the kubeconfig written, read and deleted
  # in instance namespaces; secrets the installer reads there; Helm's release Secrets and the
  # exported kubeconfig in host namespaces.
  - apiGroups: [""]
    resources: [secrets]
    verbs: [get, list, watch, create, update, patch, delete]
  # service/vcluster: watched everywhere, recreated when deleted; Helm installs, upgrades (patch)
  # and uninstalls the release's Services; update is in the vCluster chart's Role.
  - apiGroups: [""]
    resources: [services]
    verbs: [get, list, watch, create, update, patch, delete]
  # Owner references relinked in host namespaces (list, patch, as on every kind vCluster syncs,
  # all below); the vCluster chart's ConfigMaps;
  # the rest is in its Role.
  - apiGroups: [""]
    resources: [configmaps]
    verbs: [get, list, watch, create, update, patch, delete]
  # The host namespace's NetworkPolicy vcluster-api; the vCluster chart's Role lets vCluster
  # sync the policies written inside to the host (sync.toHost.networkPolicies).
  - apiGroups: [networking.k8s.io]
    resources: [networkpolicies]
    verbs: [get, list, watch, create, update, patch, delete]
  # The vCluster control plane, the Deployment vcluster: read for readiness, scaled to zero
  # before every helm upgrade; installed, upgraded and uninstalled by Helm. The chart's Role
  # grants get, list, watch, patch and update on these kinds.
  - apiGroups: [apps]
    resources: [deployments, statefulsets, replicasets]
    verbs: [get, list, watch, create, update, patch, delete]
  # Deleting with Retain: the PersistentVolumes bound to claims in the host namespace are read
  # and set to Retain (a merge patch) before the namespace goes.
  - apiGroups: [""]
    resources: [persistentvolumes]
    verbs: [get, list, patch]
  # The node that holds an instance's storage: whether it still exists (get only).
  - apiGroups: [""]
    resources: [nodes]
    verbs: [get]
  # Events about instances (create, patch); get, list and watch are in the vCluster chart's Role.
  - apiGroups: [events.k8s.io]
    resources: [events]
    verbs: [get, list, watch, create, patch]
  # The admission policy that protects each service/vcluster, and its binding (server-side
  # apply: a patch, and a create the first time; both name the object).
  - apiGroups: [admissionregistration.k8s.io]
    resources: [validatingadmissionpolicies, validatingadmissionpolicybindings]
    verbs: [create, patch]
    resourceNames: [platform-operator-protect-vcluster-service]
  # The vCluster chart's own objects (ServiceAccounts, Role and RoleBinding) ...
  - apiGroups: [""]
    resources: [serviceaccounts]
    verbs: [get, list, watch, create, update, patch, delete]
  - apiGroups: [rbac.authorization.k8s.io]
    resources: [roles, rolebindings]
    verbs: [get, list, watch, create, update, patch, delete]
  # ... and what its Role (vCluster 0.37, with the operator's values) grants the vCluster
  # syncer in the host namespace (e2e/tests/vcluster_chart.rs checks it against the real chart). The controller lists and watches the control plane's pods itself.
  - apiGroups: [""]
    resources: [pods, pods/attach, pods/portforward, pods/exec, persistentvolumeclaims, endpoints]
    verbs: [get, list, watch, create, update, patch, delete]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [get, list, watch, create, update, patch, delete]
  - apiGroups: [""]
    resources: [pods/status, pods/ephemeralcontainers, pods/resize]
    verbs: [patch, update]
  - apiGroups: [""]
    resources: [events]
    verbs: [get, list, watch, create, patch]
  - apiGroups: [""]
    resources: [pods/log]
    verbs: [get, list, watch]
  {{- with .Values.rbac.extraRules }}
  # rbac.extraRules
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{- define "platform-operator-controller.deployment" -}}
{{- $home := include "platform-operator.home" . -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: platform-operator-controller
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "platform-operator.labels" (dict "root" . "component" "controller") | nindent 4 }}
spec:
  replicas: {{ .Values.replicaCount }}
  # The old pod stops (and its helm and pulumi with it) before the new one starts: never two
  # writers on one Pulumi stack, and a ReadWriteOnce state claim is free for the new pod.
  strategy:
    type: Recreate
  selector:
    matchLabels:
      {{- include "platform-operator.selectorLabels" (dict "root" . "component" "controller") | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "platform-operator.labels" (dict "root" . "component" "controller") | nindent 8 }}
      {{- include "platform-operator.scrapeAnnotations" . | nindent 6 }}
    spec:
      serviceAccountName: {{ include "platform-operator.controllerServiceAccount" . }}
      automountServiceAccountToken: true
      securityContext:
        {{- include "platform-operator.podSecurityContext" . | nindent 8 }}
      # Installs in progress stop and resume after a restart; give helm and pulumi time to stop.
      terminationGracePeriodSeconds: 60
      containers:
        - name: controller
          image: {{ include "platform-operator.image" . }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          command: [/usr/local/bin/controller]
          args:
            - {{ printf "--leader-elect=%v" .Values.leaderElect | quote }}
            - {{ printf "--storage-root-base=%v" .Values.storageRootBase | quote }}
            - {{ printf "--install-timeout=%v" .Values.installTimeout | quote }}
            - {{ printf "--repair-interval=%v" .Values.repairInterval | quote }}
            - {{ printf "--target-poll=%v" .Values.targetPoll | quote }}
            - {{ printf "--max-concurrent-installs=%v" .Values.maxConcurrentInstalls | quote }}
            - {{ printf "--max-retries=%v" .Values.maxRetries | quote }}
            {{- with .Values.defaultInstanceResources }}
            - {{ printf "--default-instance-resources=%s" (toJson .) | quote }}
            {{- end }}
            {{- with .Values.cleanupNamespace }}
            - {{ printf "--cleanup-namespace=%v" . | quote }}
            {{- end }}
            - {{ printf "--cleanup-image=%v" (.Values.cleanupImage | default (include "platform-operator.image" .)) | quote }}
            - {{ printf "--npm-registry=%v" .Values.npmRegistry | quote }}
            {{- if .Values.npmRegistrySecret.name }}
            - --npm-registry-file=/etc/platform-operator/npm-registry/url
            {{- end }}
            - {{ printf "--npm-allow-scripts=%v" .Values.npmAllowScripts | quote }}
            - {{ printf "--pulumi-sdk-version=%v" .Values.pulumiSdkVersion | quote }}
            - {{ printf "--pod-security-standard=%v" .Values.podSecurityStandard | quote }}
            - {{ printf "--install-image=%v" (include "platform-operator.image" .) | quote }}
            - {{ printf "--install-state-claim=%v" (include "platform-operator.stateClaim" .) | quote }}
            - {{ printf "--install-pod-resources=%s" (toJson .Values.installPod.resources) | quote }}
            - --state-dir={{ include "platform-operator.stateDir" . }}
            - --passphrase-file={{ include "platform-operator.passphraseDir" . }}/passphrase
            - --metrics-bind-address=0.0.0.0:{{ include "platform-operator.opsPort" . }}
            {{- include "platform-operator.metricsArgs" . | nindent 12 }}
            {{- range .Values.extraArgs }}
            - {{ . | quote }}
            {{- end }}
          env:
            {{- include "platform-operator.podEnv" . | nindent 12 }}
            # The node install pods run on (--install-node): the state claim is ReadWriteOnce.
            - name: NODE_NAME
              valueFrom:
                fieldRef:
                  fieldPath: spec.nodeName
            - name: HOME
              value: {{ $home }}
            - name: TMPDIR
              value: /tmp
            {{- with .Values.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - name: metrics
              containerPort: {{ include "platform-operator.opsPort" . }}
              protocol: TCP
          {{- include "platform-operator.probes" . | nindent 10 }}
          resources:
            {{- toYaml .Values.resources | nindent 12 }}
          securityContext:
            {{- include "platform-operator.containerSecurityContext" . | nindent 12 }}
          volumeMounts:
            - name: state
              mountPath: {{ include "platform-operator.stateDir" . }}
            - name: passphrase
              mountPath: {{ include "platform-operator.passphraseDir" . }}
              readOnly: true
            - name: home
              mountPath: {{ $home }}
            - name: tmp
              mountPath: /tmp
            {{- if .Values.npmRegistrySecret.name }}
            - name: npm-registry
              mountPath: /etc/platform-operator/npm-registry
              readOnly: true
            {{- end }}
            {{- include "platform-operator.metricsCertMount" . | nindent 12 }}
      volumes:
        - name: state
          persistentVolumeClaim:
            claimName: {{ include "platform-operator.stateClaim" . }}
        - name: passphrase
          secret:
            secretName: {{ include "platform-operator.passphraseSecret" . }}
            defaultMode: 0440
            items:
              - key: passphrase
                path: passphrase
        - name: home
          emptyDir:
            sizeLimit: {{ .Values.emptyDirSizeLimit.home }}
        - name: tmp
          emptyDir:
            sizeLimit: {{ .Values.emptyDirSizeLimit.tmp }}
        {{- with .Values.npmRegistrySecret.name }}
        - name: npm-registry
          secret:
            secretName: {{ . }}
            defaultMode: 0440
            items:
              - key: {{ $.Values.npmRegistrySecret.key }}
                path: url
        {{- end }}
        {{- include "platform-operator.metricsCertVolume" . | nindent 8 }}
{{- end -}}
