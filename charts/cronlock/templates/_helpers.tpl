{{/*
The chart's name, or nameOverride.
*/}}
{{- define "cronlock.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
A fully qualified name for the release's objects, at most 63 characters (DNS label).
When the release name already contains the chart name it is used as is.
*/}}
{{- define "cronlock.fullname" -}}
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

{{/*
Chart name and version, as used by the helm.sh/chart label.
*/}}
{{- define "cronlock.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Common labels.
*/}}
{{- define "cronlock.labels" -}}
helm.sh/chart: {{ include "cronlock.chart" . }}
{{ include "cronlock.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: cronlock
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Selector labels: stable for the life of the release (a Deployment's selector is immutable).
*/}}
{{- define "cronlock.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cronlock.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The ServiceAccount the operator runs as.
*/}}
{{- define "cronlock.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cronlock.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Images: repository:tag, the tag defaulting to the chart's appVersion.
*/}}
{{- define "cronlock.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "cronlock.sidecarImage" -}}
{{- printf "%s:%s" .Values.sidecarImage.repository (.Values.sidecarImage.tag | default .Chart.AppVersion) }}
{{- end }}
