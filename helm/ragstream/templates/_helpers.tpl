{{/*
Chart name, truncated to the 63 characters Kubernetes names allow.
*/}}
{{- define "ragstream.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name: release-chart, unless the release name already contains the chart name.
*/}}
{{- define "ragstream.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ragstream.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Common labels.
*/}}
{{- define "ragstream.labels" -}}
helm.sh/chart: {{ include "ragstream.chart" . }}
{{ include "ragstream.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ragstream
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "ragstream.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ragstream.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Per-component names and labels: include with (dict "root" $ "component" "ingest").
*/}}
{{- define "ragstream.componentName" -}}
{{- printf "%s-%s" (include "ragstream.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ragstream.componentLabels" -}}
{{ include "ragstream.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "ragstream.componentSelectorLabels" -}}
{{ include "ragstream.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "ragstream.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ragstream.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ragstream.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "ragstream.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-secrets" (include "ragstream.fullname" .)) }}
{{- end }}

{{- define "ragstream.configMapName" -}}
{{- printf "%s-config" (include "ragstream.fullname" .) }}
{{- end }}

{{/*
The Qdrant URL: the bundled chart's Service when qdrant.enabled, else config.store.url.
*/}}
{{- define "ragstream.storeUrl" -}}
{{- if .Values.qdrant.enabled }}
{{- printf "http://%s-qdrant:6333" .Release.Name }}
{{- else }}
{{- required "config.store.url is required (or set qdrant.enabled=true)" .Values.config.store.url }}
{{- end }}
{{- end }}

{{/*
Secret-backed environment shared by both services (keys may be absent: optional).
*/}}
{{- define "ragstream.secretEnv" -}}
{{- $secret := include "ragstream.secretName" . }}
{{- range $env, $key := dict "RAGSTREAM_KAFKA__SASL_USERNAME" "kafka-sasl-username" "RAGSTREAM_KAFKA__SASL_PASSWORD" "kafka-sasl-password" "RAGSTREAM_STORE__API_KEY" "store-api-key" "RAGSTREAM_SOR__DSN" "sor-dsn" }}
- name: {{ $env }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $key }}
      optional: true
{{- end }}
{{- if eq .Values.config.embedder.kind "openai" }}
- name: RAGSTREAM_EMBEDDER__API_KEY_FILE
  value: /etc/ragstream/secrets/embedder-api-key
{{- end }}
{{- end }}

{{/*
A probe from values: everything but `enabled`, plus the handler given in .handler.
*/}}
{{- define "ragstream.probe" -}}
{{- $probe := omit .probe "enabled" }}
{{- toYaml (merge $probe .handler) }}
{{- end }}

{{/*
Pod annotations that roll the pods when their configuration changes.
*/}}
{{- define "ragstream.configChecksums" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- if not .Values.secrets.existingSecret }}
checksum/secret: {{ include (print .Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end }}
{{- end }}
