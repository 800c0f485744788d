{{/*
One operator per CronJob. Two releases whose watches overlap would both reconcile the same
CronJobs (each injecting, reverting and deleting Jobs by its own settings), so an install
or upgrade fails, naming the other release, when an operator Deployment of another
cronlock release in the cluster watches a namespace this one would watch. Each operator
Deployment records its watch in the annotation cronlock.io/watch-namespaces ("*" = every
namespace). `lookup` sees the cluster only in `helm install`/`upgrade`; `helm template`
and `--dry-run=client` check nothing here, and the release's one-operator policy
(one-operator-policy.yaml) refuses the overlapping Deployment at the API server instead.
*/}}
{{- define "cronlock.watchAnnotation" -}}
{{- if .Values.watchNamespaces }}{{ join "," .Values.watchNamespaces }}{{ else }}*{{ end }}
{{- end }}

{{- define "cronlock.checkOneOperator" -}}
{{- $root := . -}}
{{- $mine := .Values.watchNamespaces -}}
{{- range (lookup "apps/v1" "Deployment" "" "").items | default list }}
{{- $labels := dig "metadata" "labels" dict . }}
{{- $ours := and (eq (get $labels "app.kubernetes.io/part-of") "cronlock") (eq (get $labels "app.kubernetes.io/component") "operator") }}
{{- $self := and (eq .metadata.namespace $root.Release.Namespace) (eq (get $labels "app.kubernetes.io/instance") $root.Release.Name) }}
{{- if and $ours (not $self) }}
{{- $theirs := dig "metadata" "annotations" "cronlock.io/watch-namespaces" "*" . }}
{{- $shared := list }}
{{- if and (not $mine) (eq $theirs "*") }}{{ $shared = list "every namespace" }}
{{- else if not $mine }}{{ $shared = splitList "," $theirs }}
{{- else if eq $theirs "*" }}{{ $shared = $mine }}
{{- else }}
{{- range $mine }}{{ if has . (splitList "," $theirs) }}{{ $shared = append $shared . }}{{ end }}{{ end }}
{{- end }}
{{- if $shared }}
{{- fail (printf "cronlock release %q in namespace %s already runs an operator watching %s; this release would watch %s too, and two operators would reconcile the same CronJobs. Give each release disjoint watchNamespaces, or upgrade that release instead." (get $labels "app.kubernetes.io/instance") .metadata.namespace (ternary "every namespace" $theirs (eq $theirs "*")) (join ", " $shared)) }}
{{- end }}
{{- end }}
{{- end }}
{{- include "cronlock.checkWatchedNamespacesExist" . }}
{{- end }}

{{/*
A watchNamespaces entry that does not exist yet would fail the install on its RoleBinding
with helm's bare `namespaces "x" not found`; say which value and what to do instead. Only
where `lookup` reaches a cluster (it sees kube-system there); `helm template` checks nothing.
*/}}
{{- define "cronlock.checkWatchedNamespacesExist" -}}
{{- if (lookup "v1" "Namespace" "" "kube-system") }}
{{- $missing := list }}
{{- range .Values.watchNamespaces }}
{{- if not (lookup "v1" "Namespace" "" .) }}{{ $missing = append $missing . }}{{ end }}
{{- end }}
{{- if $missing }}
{{- fail (printf "watchNamespaces names %s, which does not exist in this cluster: the operator's RoleBinding there cannot be made. Create it first (kubectl create namespace %s), or leave it out of watchNamespaces and add it with helm upgrade once it exists." (join ", " $missing) (join " " $missing)) }}
{{- end }}
{{- end }}
{{- end }}
