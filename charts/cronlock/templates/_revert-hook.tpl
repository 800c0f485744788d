{{/*
A hook that runs `cronlock-operator --uninstall` with an account of its own: every injected
CronJob in its scope back as written, and the Leases, holder Roles and RoleBindings
cronlock made there deleted. The account goes with the hook once it succeeded; on failure
it stays, for its log. Parameters (a dict): root (the chart's .), name, hook (the helm.sh
annotations), scopes (the namespaces to bind in; "" = cluster-wide), namespaces
(CRONLOCK_NAMESPACES; "" = every one), keep (CRONLOCK_KEEP_NAMESPACES: left alone) and
revertOnly (only the CronJobs: the Leases and holder Roles stay, for runs in progress).

The account is confined like the operator's (_scope-policy.tpl) by a policy of its own,
made with the hook: the chart's policies are gone by the time a post-delete hook runs.
Everything but the Job goes whether the hook succeeds or fails: no account with
cluster-wide CronJob rights outlives it. The Job and its pod stay after a failure, for
`kubectl logs`; the pod's token dies with the account.
*/}}
{{- define "cronlock.revertHook" -}}
{{- $p := . -}}
{{- $root := .root -}}
{{- $cluster := printf "%s-%s" $p.name $root.Release.Namespace | trunc 253 | trimSuffix "-" -}}
{{- $transient := merge (dict "helm.sh/hook-weight" "-10" "helm.sh/hook-delete-policy" "before-hook-creation,hook-succeeded,hook-failed") $p.hook -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ $p.name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "cronlock.labels" $root | nindent 4 }}
  annotations:
    {{- toYaml $transient | nindent 4 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ $cluster }}
  labels:
    {{- include "cronlock.labels" $root | nindent 4 }}
  annotations:
    {{- toYaml $transient | nindent 4 }}
rules:
  - apiGroups: ["batch"]
    resources: ["cronjobs"]
    verbs: ["list", "patch"]
  # A NotReverted Warning on a CronJob it cannot revert (its author's odd record).
  - apiGroups: [""]
    resources: ["events"]
    verbs: ["create"]
  {{- if not $p.revertOnly }}
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["list", "delete"]
  - apiGroups: ["rbac.authorization.k8s.io"]
    resources: ["roles", "rolebindings"]
    verbs: ["list", "delete"]
  {{- end }}
{{- range $p.scopes }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: {{ if . }}RoleBinding{{ else }}ClusterRoleBinding{{ end }}
metadata:
  name: {{ if . }}{{ $p.name }}{{ else }}{{ $cluster }}{{ end }}
  {{- if . }}
  namespace: {{ . }}
  {{- end }}
  labels:
    {{- include "cronlock.labels" $root | nindent 4 }}
  annotations:
    {{- toYaml $transient | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ $cluster }}
subjects:
  - kind: ServiceAccount
    name: {{ $p.name }}
    namespace: {{ $root.Release.Namespace }}
{{- end }}
{{- if $root.Values.admissionPolicy.enabled }}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ $cluster }}-scope
  labels:
    {{- include "cronlock.labels" $root | nindent 4 }}
  annotations:
    {{- toYaml $transient | nindent 4 }}
spec:
  {{- $user := printf "system:serviceaccount:%s:%s" $root.Release.Namespace $p.name }}
  {{- include "cronlock.scopePolicySpec" (dict "root" $root "users" (list $user) "namespaces" (compact (splitList "," $p.namespaces)) "excluded" (compact (splitList "," $p.keep)) "leader" "") | nindent 2 }}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ $cluster }}-scope
  labels:
    {{- include "cronlock.labels" $root | nindent 4 }}
  annotations:
    {{- toYaml $transient | nindent 4 }}
spec:
  policyName: {{ $cluster }}-scope
  validationActions: ["Deny"]
{{- end }}
---
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ $p.name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "cronlock.labels" $root | nindent 4 }}
  annotations:
    {{- toYaml (merge (dict "helm.sh/hook-weight" "0") $p.hook) | nindent 4 }}
spec:
  backoffLimit: 2
  template:
    metadata:
      labels:
        {{- include "cronlock.hookLabels" (dict "root" $root "component" "revert") | nindent 8 }}
    spec:
      serviceAccountName: {{ $p.name }}
      restartPolicy: Never
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      {{- with include "cronlock.imagePullSecrets" $root }}
      imagePullSecrets:
        {{- . | nindent 8 }}
      {{- end }}
      {{- with $root.Values.priorityClassName }}
      priorityClassName: {{ . | quote }}
      {{- end }}
      {{- with include "cronlock.placement" $root }}
      {{- . | nindent 6 }}
      {{- end }}
      containers:
        - name: revert
          image: {{ include "cronlock.image" $root | quote }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args: {{ if $p.revertOnly }}["--uninstall", "--revert-only"]{{ else }}["--uninstall"]{{ end }}
          env:
            - name: CRONLOCK_NAMESPACES
              value: {{ $p.namespaces | quote }}
            {{- if $p.keep }}
            - name: CRONLOCK_KEEP_NAMESPACES
              value: {{ $p.keep | quote }}
            {{- end }}
            - name: CRONLOCK_LOG_FORMAT
              value: {{ $root.Values.logFormat | quote }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          {{- with $root.Values.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
      volumes:
        - name: tmp
          emptyDir:
            sizeLimit: 16Mi
{{- end }}
