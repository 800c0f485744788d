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
The name of a cluster-scoped object of the release (ClusterRole, ClusterRoleBinding,
admission policies and their bindings): the fullname and the release's namespace, so the
same release name in two namespaces does not collide. Given the root context.
*/}}
{{- define "cronlock.clusterName" -}}
{{- printf "%s-%s" (include "cronlock.fullname" .) .Release.Namespace | trunc 253 | trimSuffix "-" }}
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
{{- include "cronlock.labelsWith" (dict "root" . "extra" dict) }}
{{- end }}

{{/*
The common labels and an object's own extra labels (podLabels, serviceMonitor.labels...),
given (dict "root" . "extra" MAP): commonLabels under the extra ones, so that a key in both
is written once, with the more specific value.
*/}}
{{- define "cronlock.labelsWith" -}}
helm.sh/chart: {{ include "cronlock.chart" .root }}
{{ include "cronlock.selectorLabels" .root }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: cronlock
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- with merge (deepCopy (.extra | default dict)) (.root.Values.commonLabels | default dict) }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Labels of the chart's hook and test objects, given (dict "root" . "component" NAME): the
release's, but not the operator's selector, so that neither the Deployment nor the metrics
Service ever counts their pods as the operator's.
*/}}
{{- define "cronlock.hookLabels" -}}
helm.sh/chart: {{ include "cronlock.chart" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: cronlock
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
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
Images: repository:tag, the tag defaulting to the chart's appVersion; repository@digest
when a digest is given. With imageRegistry, the repository's registry (its first part, when
that names a host: a dot, a port or localhost) is that registry instead, or the registry is
put in front: one setting for a mirror, which the operator's policy follows too, as it names
the images through this same template. global.imageRegistry, when set, wins over
imageRegistry, as in Bitnami's charts: a parent chart points all its subcharts at one mirror.
*/}}
{{- define "cronlock.imageRef" -}}
{{- $repository := .image.repository }}
{{- with (.root.Values.global | default dict).imageRegistry | default .root.Values.imageRegistry }}
{{- $parts := splitn "/" 2 $repository }}
{{- $host := $parts._0 }}
{{- if and $parts._1 (or (contains "." $host) (contains ":" $host) (eq $host "localhost")) }}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) $parts._1 }}
{{- else }}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) $repository }}
{{- end }}
{{- end }}
{{- if .image.digest }}
{{- printf "%s@%s" $repository .image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (.image.tag | default .root.Chart.AppVersion) }}
{{- end }}
{{- end }}

{{- define "cronlock.image" -}}
{{- include "cronlock.imageRef" (dict "image" .Values.image "root" .) }}
{{- end }}

{{- define "cronlock.sidecarImage" -}}
{{- include "cronlock.imageRef" (dict "image" .Values.sidecarImage "root" .) }}
{{- end }}

{{/*
A CEL test that `expr` (an image reference) names the given image. By digest: any
repository serving that digest, as the content is pinned, not where it is pulled from (a
mirror, or Kustomize's `images:` renaming install.yaml's images, keeps it; a registry
cannot serve other content under it, as the container runtime checks it). By tag: exactly the
reference, as a tag pins nothing but its name.
*/}}
{{- define "cronlock.admitsImage" -}}
{{- if .image.digest -}}
{{ .expr }}.matches({{ printf "^[^@]+@%s$" .image.digest | quote }})
{{- else -}}
{{ .expr }} == {{ include "cronlock.imageRef" (dict "image" .image "root" .root) | quote }}
{{- end }}
{{- end }}

{{/* The stores image, or "" when its repository is empty. */}}
{{- define "cronlock.sidecarStoresImage" -}}
{{- if .Values.sidecarStoresImage.repository }}
{{- include "cronlock.imageRef" (dict "image" .Values.sidecarStoresImage "root" .) }}
{{- end }}
{{- end }}

{{/*
A Go duration ("90s", "1m30s", "1.5h") in seconds, as a float; "" for anything else.
*/}}
{{- define "cronlock.seconds" -}}
{{- $text := toString . -}}
{{- if regexMatch "^([0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$" $text -}}
{{- $units := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h)" $text -1 -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" . -}}
{{- $unit := trimPrefix $number . -}}
{{- $total = addf $total (mulf (float64 $number) (get $units $unit)) -}}
{{- end -}}
{{- $total -}}
{{- end -}}
{{- end }}

{{/*
defaults.ttl and defaults.renew as the operator checks them (operator/src/cronlock_operator/
cronjob/defaults.py, check_defaults): a ttl of whole seconds from 19s (the shortest that leaves
room to stop a run that lost its lease, with the 2s clock skew) to 24h; a renew from 1s to
a third of the ttl. tests/integration/chart/test_values.py renders both sides of every bound and
compares with the operator's own verdict, so the two cannot drift apart.
*/}}
{{- define "cronlock.checkDefaults" -}}
{{- $ttl := include "cronlock.seconds" .Values.defaults.ttl -}}
{{- if or (eq $ttl "") (lt (float64 $ttl) 19.0) (gt (float64 $ttl) 86400.0) (ne (float64 $ttl) (floor (float64 $ttl))) -}}
{{- fail (printf "defaults.ttl: %q is not one the operator accepts; expected whole seconds from 19s to 24h (e.g. 60s, 5m)" .Values.defaults.ttl) -}}
{{- end -}}
{{- with .Values.defaults.renew -}}
{{- $renew := include "cronlock.seconds" . -}}
{{- if or (eq $renew "") (lt (float64 $renew) 1.0) (gt (mulf (float64 $renew) 3.0) (float64 $ttl)) -}}
{{- fail (printf "defaults.renew: %q is not one the operator accepts; expected from 1s to a third of defaults.ttl (%s)" . $.Values.defaults.ttl) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
Where the operator's pods may run: nodeSelector, affinity and tolerations from the values,
for the operator and for every pod the chart runs beside it (hooks, helm test), which
need the same nodes. Given the root context; indent with nindent.
*/}}
{{- define "cronlock.placement" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Which Leases this release's Lease policies judge: the Leases of locks (cronlock's label and
cronlock.io/lock; a release's leader Lease carries no lock label) in the namespaces the
release watches. Two releases watch disjoint namespaces (cronlock.checkOneOperator), so
neither judges the other's operator, hooks or Leases.
*/}}
{{- define "cronlock.lockLeaseSelectors" -}}
objectSelector:
  matchLabels:
    app.kubernetes.io/managed-by: cronlock
  matchExpressions:
    - {key: cronlock.io/lock, operator: Exists}
{{- if .Values.watchNamespaces }}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: In
      values: {{ toJson .Values.watchNamespaces }}
{{- end }}
{{- end }}

{{/*
The pull secrets of every pod the chart runs: global.imagePullSecrets (names or {name:}
references, as Bitnami-style parent charts set them), then imagePullSecrets, each Secret
once. Given the root context; "" when there are none, else a YAML list to nindent.
*/}}
{{- define "cronlock.imagePullSecrets" -}}
{{- $names := list }}
{{- range concat ((.Values.global | default dict).imagePullSecrets | default list) .Values.imagePullSecrets }}
{{- if kindIs "string" . }}
{{- $names = append $names . }}
{{- else }}
{{- $names = append $names .name }}
{{- end }}
{{- end }}
{{- $refs := list }}
{{- range $names | uniq }}
{{- $refs = append $refs (dict "name" .) }}
{{- end }}
{{- with $refs }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/*
Whether the enabled prometheus-operator objects are rendered (monitoring.renderMode):
"true" where monitoring.coreos.com/v1 is served or under alwaysRender, else "". Under
failIfMissing, where it is not served, the render fails naming `value` (the enabled key).
Given (dict "root" . "value" "serviceMonitor.enabled").
*/}}
{{- define "cronlock.renderMonitor" -}}
{{- $mode := .root.Values.monitoring.renderMode }}
{{- if or (eq $mode "alwaysRender") (.root.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") -}}
true
{{- else if eq $mode "failIfMissing" -}}
{{- fail (printf "%s is true but this cluster does not serve monitoring.coreos.com/v1 (monitoring.renderMode=failIfMissing): install the prometheus-operator CRDs first; under helm template, which sees no cluster, pass --api-versions monitoring.coreos.com/v1 or set monitoring.renderMode=alwaysRender" .value) -}}
{{- end -}}
{{- end }}
