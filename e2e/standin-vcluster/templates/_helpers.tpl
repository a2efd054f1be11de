{{/*
STAND-IN helpers. The rules follow the real chart 0.37 (written from its documented behaviour,
not copied): the control plane is a StatefulSet only with a volume claim (explicit, templates,
or "auto" with the embedded database) or with embedded etcd; otherwise a Deployment.
*/}}

{{- define "standin.labels" -}}
app: vcluster
chart: "{{ .Chart.Name }}-{{ .Chart.Version }}"
release: {{ .Release.Name | quote }}
heritage: {{ .Release.Service | quote }}
{{- end -}}

{{/* The embedded database (kine over SQLite) is the backing store when no other one is chosen. */}}
{{- define "standin.embeddedDatabase" -}}
{{- $bs := .Values.controlPlane.backingStore -}}
{{- if not (or $bs.etcd.embedded.enabled $bs.etcd.deploy.enabled $bs.etcd.external.enabled $bs.database.external.enabled) -}}
true
{{- end -}}
{{- end -}}

{{- define "standin.volumeClaim" -}}
{{- $p := .Values.controlPlane.statefulSet.persistence -}}
{{- $enabled := toString $p.volumeClaim.enabled -}}
{{- if $p.volumeClaimTemplates -}}
true
{{- else if eq $enabled "true" -}}
true
{{- else if and (eq $enabled "auto") (or (include "standin.embeddedDatabase" .) .Values.controlPlane.backingStore.etcd.embedded.enabled) -}}
true
{{- end -}}
{{- end -}}

{{- define "standin.kind" -}}
{{- if or (include "standin.volumeClaim" .) .Values.controlPlane.backingStore.etcd.embedded.enabled -}}
StatefulSet
{{- else -}}
Deployment
{{- end -}}
{{- end -}}
