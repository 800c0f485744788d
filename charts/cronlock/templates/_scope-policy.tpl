{{/*
The spec of a ValidatingAdmissionPolicy that confines cronlock's own accounts (the
operator's, and the uninstall and upgrade hooks') to the objects cronlock makes and the
injection it writes, whatever their RBAC allows (docs/SECURITY.md, "What a stolen
operator token can do"). Parameters (a dict): root (the chart's .), users (the accounts'
usernames), namespaces (where they may write; empty = every namespace but kube-system and
kube-node-lease), excluded (namespaces never to write in), leader (the name of the operator's leader Lease in the release namespace,
or "").

CEL cannot drop a field from an object, so "the pod template as before, but for the
injection" is written field by field: every field of the pod spec, the containers, the
Job spec and the CronJob spec that injection never writes must stay as it was. The lists
are the fields of Kubernetes v1.37's types (k8s.io/api); tests/integration/
test_admission_policy.py checks them against the API server's OpenAPI schema, so a field
added by a Kubernetes bump fails the test until it is named here. On an older API server a
field it does not know is simply absent on both sides.
*/}}
{{- define "cronlock.scopePolicySpec" -}}
{{- $root := .root -}}
{{- $podFields := list "activeDeadlineSeconds" "affinity" "automountServiceAccountToken" "dnsConfig" "dnsPolicy" "enableServiceLinks" "ephemeralContainers" "evictionResponders" "hostAliases" "hostIPC" "hostNetwork" "hostPID" "hostUsers" "hostname" "hostnameOverride" "imagePullSecrets" "nodeName" "nodeSelector" "os" "overhead" "preemptionPolicy" "priority" "priorityClassName" "readinessGates" "resourceClaims" "resources" "runtimeClassName" "schedulerName" "schedulingGates" "schedulingGroup" "securityContext" "serviceAccount" "serviceAccountName" "setHostnameAsFQDN" "subdomain" "tolerations" "topologySpreadConstraints" "workloadRef" -}}
{{- $containerFields := list "args" "command" "env" "envFrom" "image" "imagePullPolicy" "lifecycle" "ports" "readinessProbe" "resizePolicy" "resources" "restartPolicy" "restartPolicyRules" "securityContext" "startupProbe" "stdin" "stdinOnce" "terminationMessagePath" "terminationMessagePolicy" "tty" "volumeDevices" "workingDir" -}}
{{- $injectedNever := list "args" "envFrom" "lifecycle" "livenessProbe" "readinessProbe" "resizePolicy" "restartPolicyRules" "startupProbe" "stdin" "stdinOnce" "tty" "volumeDevices" "workingDir" -}}
{{- $securityNever := list "appArmorProfile" "procMount" "seLinuxOptions" "windowsOptions" -}}
{{- $jobFields := list "activeDeadlineSeconds" "backoffLimit" "backoffLimitPerIndex" "completionMode" "completions" "managedBy" "manualSelector" "maxFailedIndexes" "parallelism" "podReplacementPolicy" "scheduling" "selector" "successPolicy" "suspend" "ttlSecondsAfterFinished" -}}
{{- $cronJobFields := list "concurrencyPolicy" "failedJobsHistoryLimit" "schedule" "startingDeadlineSeconds" "successfulJobsHistoryLimit" "suspend" "timeZone" -}}
failurePolicy: Fail
matchConstraints:
  resourceRules:
    - apiGroups: ["coordination.k8s.io"]
      apiVersions: ["v1"]
      operations: ["CREATE", "UPDATE", "DELETE"]
      resources: ["leases"]
    - apiGroups: ["rbac.authorization.k8s.io"]
      apiVersions: ["v1"]
      operations: ["CREATE", "UPDATE", "DELETE"]
      resources: ["roles", "rolebindings"]
    - apiGroups: ["batch"]
      apiVersions: ["v1"]
      operations: ["CREATE", "UPDATE", "DELETE"]
      resources: ["cronjobs", "jobs"]
    - apiGroups: [""]
      apiVersions: ["v1"]
      operations: ["CREATE", "UPDATE", "DELETE"]
      resources: ["events"]
    - apiGroups: ["events.k8s.io"]
      apiVersions: ["v1"]
      operations: ["CREATE", "UPDATE", "DELETE"]
      resources: ["events"]
matchConditions:
  - name: cronlocks-own-accounts
    expression: >-
      request.userInfo.username in {{ toJson .users }}
variables:
  - name: resource
    expression: "request.resource.resource"
  - name: newPod
    expression: "object.spec.jobTemplate.spec.template.spec"
  - name: oldPod
    expression: "oldObject.spec.jobTemplate.spec.template.spec"
  # The variables injection writes into cronlock's containers (injection/containers.py),
  # never CRONLOCK_STORE (a URL in the pod spec) or CRONLOCK_IDENTITY (another holder's name).
  - name: injectedEnv
    expression: >-
      ["CRONLOCK_LEASE", "CRONLOCK_TTL", "CRONLOCK_RENEW", "CRONLOCK_POLICY",
      "CRONLOCK_WAIT_TIMEOUT", "CRONLOCK_JITTER", "CRONLOCK_STOP", "CRONLOCK_KILL_GRACE",
      "CRONLOCK_MAX_HOLD", "CRONLOCK_SKEW",
      "CRONLOCK_PORT", "CRONLOCK_RUN_DIR", "CRONLOCK_POD_NAME", "CRONLOCK_POD_UID",
      "CRONLOCK_POD_NAMESPACE", "CRONLOCK_JOB_NAME", "CRONLOCK_STORE_FILE",
      "CRONLOCK_STORE_KIND", "CRONLOCK_LOG_FORMAT", "CRONLOCK_LOG_LEVEL",
      "CRONLOCK_OPERATOR_VERSION", "CRONLOCK_CRONJOB", "CRONLOCK_JOB_UID", "CRONLOCK_CLUSTER"]
  # The sidecar's identity is built from these (sidecar options.py), so they are the pod's
  # own fields, exactly as injection/containers.py writes them, never literal values.
  - name: podFieldEnv
    expression: >-
      {"CRONLOCK_POD_NAME": "metadata.name", "CRONLOCK_POD_UID": "metadata.uid",
      "CRONLOCK_POD_NAMESPACE": "metadata.namespace",
      "CRONLOCK_JOB_NAME": "metadata.labels['batch.kubernetes.io/job-name']",
      "CRONLOCK_JOB_UID": "metadata.labels['batch.kubernetes.io/controller-uid']"}
  - name: newNotes
    expression: "object.metadata.?annotations.orValue({})"
  - name: oldNotes
    expression: "oldObject.metadata.?annotations.orValue({})"
  - name: newLabels
    expression: "object.metadata.?labels.orValue({})"
  - name: oldLabels
    expression: "oldObject.metadata.?labels.orValue({})"
  - name: injected
    expression: {{ toJson (list "cronlock" "cronlock-gate") | quote }}
  - name: ours
    expression: >-
      (request.operation == "DELETE" || (has(object.metadata.labels) &&
      object.metadata.labels[?"app.kubernetes.io/managed-by"].orValue("") == "cronlock")) &&
      (request.operation == "CREATE" || (has(oldObject.metadata.labels) &&
      oldObject.metadata.labels[?"app.kubernetes.io/managed-by"].orValue("") == "cronlock"))
  # The user's containers (regular and init) by name, in order, before and after.
  - name: userContainersKept
    expression: >-
      variables.newPod.containers.map(c, c.name) == variables.oldPod.containers.map(c, c.name) &&
      variables.newPod.?initContainers.orValue([]).filter(c, !(c.name in variables.injected)).map(c, c.name) ==
      variables.oldPod.?initContainers.orValue([]).filter(c, !(c.name in variables.injected)).map(c, c.name)
  - name: newUserContainers
    expression: >-
      variables.newPod.containers +
      variables.newPod.?initContainers.orValue([]).filter(c, !(c.name in variables.injected))
  - name: oldUserContainers
    expression: >-
      variables.oldPod.containers +
      variables.oldPod.?initContainers.orValue([]).filter(c, !(c.name in variables.injected))
  # The grace period the user wrote, as injection recorded it (the API server's default,
  # 30, when none was written; -1 when nothing was recorded): a re-injection may raise the
  # grace it shortened, up to that, and a revert gives it back.
  - name: originalGrace
    expression: >-
      variables.oldNotes[?"cronlock.io/original-termination-grace-period-seconds"].orValue("-") == "unset" ? 30 :
      variables.oldNotes[?"cronlock.io/original-termination-grace-period-seconds"].orValue("-").matches("^[0-9]{1,10}$") ?
      int(variables.oldNotes["cronlock.io/original-termination-grace-period-seconds"]) : -1
  # The CronJob's own lock Lease (cronjob/config.py: the lock defaults to its name).
  - name: lease
    expression: >-
      request.namespace + "/cronlock-" +
      variables.newNotes[?"cronlock.io/lock"].orValue(object.metadata.name)
  - name: newInjected
    expression: >-
      variables.newPod.?initContainers.orValue([]).filter(c, c.name in variables.injected)
  # policy: queue (issue 58): the job template's sidecar runs under queue, so each run's
  # Job is created suspended (jobTemplate.spec.suspend: true) and the operator lets it go.
  - name: newQueued
    expression: >-
      variables.newPod.?initContainers.orValue([]).exists(c, c.name == "cronlock" &&
      c.?env.orValue([]).exists(e, e.name == "CRONLOCK_POLICY" && e.?value.orValue("") == "queue"))
  - name: oldQueued
    expression: >-
      variables.oldPod.?initContainers.orValue([]).exists(c, c.name == "cronlock" &&
      c.?env.orValue([]).exists(e, e.name == "CRONLOCK_POLICY" && e.?value.orValue("") == "queue"))
  # A queued Job let go: spec.suspend true to false and nothing else of its spec, only on a
  # Job a CronJob controls whose own pod template runs cronlock's sidecar under queue (a
  # Job's template is what its CronJob's was when it was made; the operator creates none).
  - name: resumed
    expression: >-
      variables.resource == "jobs" && request.operation == "UPDATE" &&
      oldObject.spec.?suspend.orValue(false) == true &&
      object.spec.?suspend.orValue(true) == false &&
      {{- range without $jobFields "suspend" }}
      object.spec.?{{ . }}.orValue(null) == oldObject.spec.?{{ . }}.orValue(null) &&
      {{- end }}
      object.spec.?podFailurePolicy.orValue(null) == oldObject.spec.?podFailurePolicy.orValue(null) &&
      object.spec.template == oldObject.spec.template &&
      oldObject.spec.template.spec.?initContainers.orValue([]).exists(c, c.name == "cronlock" &&
      c.?env.orValue([]).exists(e, e.name == "CRONLOCK_POLICY" && e.?value.orValue("") == "queue")) &&
      oldObject.metadata.?ownerReferences.orValue([]).exists(o, o.kind == "CronJob" &&
      o.?controller.orValue(false) == true)
validations:
  - expression: '!(request.namespace in ["kube-system", "kube-node-lease"])'
    message: "cronlock never writes in kube-system or kube-node-lease"
    reason: Forbidden
  {{- with .namespaces }}
  - expression: 'request.namespace in {{ toJson . }}'
    message: "cronlock writes only in the namespaces it was installed for: {{ join ", " . }}"
    reason: Forbidden
  {{- end }}
  {{- with .excluded }}
  - expression: '!(request.namespace in {{ toJson . }})'
    message: "this cronlock hook leaves {{ join ", " . }} alone"
    reason: Forbidden
  {{- end }}
  - expression: >-
      variables.resource in ["cronjobs", "jobs", "events"] || variables.ours
    message: >-
      cronlock writes only objects labelled app.kubernetes.io/managed-by=cronlock (Leases,
      Roles, RoleBindings), before and after the change
    reason: Forbidden
  - expression: >-
      variables.resource != "leases" || request.operation == "DELETE" ||
      object.metadata.name.startsWith("cronlock-")
      {{- with .leader }} ||
      (request.namespace == {{ $root.Release.Namespace | quote }} && object.metadata.name == {{ . | quote }})
      {{- end }}
    message: "cronlock's Leases are named cronlock-* (or are the operator's leader Lease)"
    reason: Forbidden
  - expression: >-
      variables.resource != "roles" || request.operation == "DELETE" ||
      (object.metadata.name.startsWith("cronlock-holder-") &&
      object.rules.all(rule, rule.apiGroups == ["coordination.k8s.io"] &&
      rule.resources == ["leases"] &&
      rule.verbs.all(verb, verb in ["get", "update", "patch"]) &&
      size(rule.?resourceNames.orValue([])) > 0 &&
      rule.resourceNames.all(name, name.startsWith("cronlock-"))))
    message: >-
      cronlock writes only holder Roles: get, update and patch on named cronlock-* Leases
    reason: Forbidden
  - expression: >-
      variables.resource != "rolebindings" || request.operation == "DELETE" ||
      (object.metadata.name.startsWith("cronlock-holder-") &&
      object.roleRef.kind == "Role" && object.roleRef.name == object.metadata.name &&
      object.subjects.all(subject, subject.kind == "ServiceAccount" &&
      subject.namespace == request.namespace))
    message: >-
      cronlock binds only its holder Role of the same name, to ServiceAccounts of the same
      namespace
    reason: Forbidden
  # Jobs: only the marks on a finished guarded run (cronlock.io/* annotations, and the
  # label cronlock.io/outcome: skipped or replaced), a queued Job let go (`resumed`), or
  # deleting a guarded run's Job.
  - expression: >-
      variables.resource != "jobs" || (request.operation != "CREATE" &&
      oldObject.metadata.?labels.orValue({})[?"cronlock.io/lock"].hasValue() &&
      (request.operation == "DELETE" || (
      (object.spec == oldObject.spec || variables.resumed) &&
      variables.newLabels.all(key, key == "cronlock.io/outcome" ?
      variables.newLabels[key] in ["skipped", "replaced"] :
      (key in variables.oldLabels && variables.oldLabels[key] == variables.newLabels[key])) &&
      variables.oldLabels.all(key, key in variables.newLabels) &&
      object.metadata.?ownerReferences.orValue([]) == oldObject.metadata.?ownerReferences.orValue([]) &&
      object.metadata.?finalizers.orValue([]) == oldObject.metadata.?finalizers.orValue([]) &&
      variables.newNotes.all(key, key.startsWith("cronlock.io/") ||
      (key in variables.oldNotes && variables.oldNotes[key] == variables.newNotes[key])) &&
      variables.oldNotes.all(key, key.startsWith("cronlock.io/") || key in variables.newNotes))))
    message: >-
      cronlock only annotates (cronlock.io/*), labels with cronlock.io/outcome, lets a
      queued Job go (spec.suspend true to false, policy: queue) and deletes the Jobs of
      guarded runs (labelled cronlock.io/lock); it never creates a Job
    reason: Forbidden
  # Events: only new ones, about a CronJob, Job or Lease of the same namespace.
  - expression: >-
      variables.resource != "events" || (request.operation == "CREATE" &&
      object.?involvedObject.?kind.orValue(object.?regarding.?kind.orValue("")) in ["CronJob", "Job", "Lease"] &&
      object.?involvedObject.?namespace.orValue(object.?regarding.?namespace.orValue("")) == request.namespace)
    message: "cronlock only creates Events about CronJobs, Jobs and Leases of their own namespace"
    reason: Forbidden
  # CronJobs: the injection or its revert, nothing else. First what injection never writes.
  - expression: >-
      variables.resource != "cronjobs" || (request.operation == "UPDATE"
      {{- range $cronJobFields }} &&
      object.spec.?{{ . }}.orValue(null) == oldObject.spec.?{{ . }}.orValue(null)
      {{- end }} &&
      object.metadata.?labels.orValue({}) == oldObject.metadata.?labels.orValue({}) &&
      object.metadata.?ownerReferences.orValue([]) == oldObject.metadata.?ownerReferences.orValue([]) &&
      object.metadata.?finalizers.orValue([]) == oldObject.metadata.?finalizers.orValue([]) &&
      variables.newNotes.all(key, key in {{ toJson (list "cronlock.io/original-restart-policy" "cronlock.io/original-share-process-namespace" "cronlock.io/original-termination-grace-period-seconds" "cronlock.io/consecutive-skips") }} ||
      (key in variables.oldNotes && variables.oldNotes[key] == variables.newNotes[key])) &&
      variables.oldNotes.all(key, key in {{ toJson (list "cronlock.io/original-restart-policy" "cronlock.io/original-share-process-namespace" "cronlock.io/original-termination-grace-period-seconds" "cronlock.io/consecutive-skips") }} ||
      key in variables.newNotes))
    message: >-
      cronlock changes only a CronJob's job template and its cronlock.io annotations (those
      it keeps: cronlock.io/original-*, cronlock.io/consecutive-skips); it never creates or
      deletes one
    reason: Forbidden
  - expression: >-
      variables.resource != "cronjobs" || (
      {{- range $i, $field := without $jobFields "suspend" }}{{ if $i }} &&{{ end }}
      object.spec.jobTemplate.spec.?{{ $field }}.orValue(null) ==
      oldObject.spec.jobTemplate.spec.?{{ $field }}.orValue(null)
      {{- end }} &&
      (object.spec.jobTemplate.spec.?suspend.orValue(null) ==
      oldObject.spec.jobTemplate.spec.?suspend.orValue(null) ||
      (object.spec.jobTemplate.spec.?suspend.orValue(false) == true &&
      !oldObject.spec.jobTemplate.spec.?suspend.hasValue() && variables.newQueued) ||
      (!object.spec.jobTemplate.spec.?suspend.hasValue() &&
      oldObject.spec.jobTemplate.spec.?suspend.orValue(false) == true && variables.oldQueued &&
      !variables.newQueued)) &&
      object.spec.jobTemplate.spec.?podFailurePolicy.?rules.orValue([]).filter(r, !(r.action == "FailJob" &&
      r.?onExitCodes.?containerName.orValue("") == "cronlock-gate" &&
      r.?onExitCodes.?operator.orValue("") == "In" && r.?onExitCodes.?values.orValue([]) == [75])) ==
      oldObject.spec.jobTemplate.spec.?podFailurePolicy.?rules.orValue([]).filter(r, !(r.action == "FailJob" &&
      r.?onExitCodes.?containerName.orValue("") == "cronlock-gate" &&
      r.?onExitCodes.?operator.orValue("") == "In" && r.?onExitCodes.?values.orValue([]) == [75])) &&
      [[object.spec.jobTemplate, oldObject.spec.jobTemplate],
       [object.spec.jobTemplate.spec.template, oldObject.spec.jobTemplate.spec.template]].all(pair,
      pair[0].?metadata.?annotations.orValue({}) == pair[1].?metadata.?annotations.orValue({}) &&
      pair[0].?metadata.?labels.orValue({}).all(k, k == "cronlock.io/lock" ||
      pair[1].?metadata.?labels.orValue({})[?k].orValue(null) == pair[0].metadata.labels[k]) &&
      pair[1].?metadata.?labels.orValue({}).all(k, k == "cronlock.io/lock" ||
      k in pair[0].?metadata.?labels.orValue({}))))
    message: >-
      cronlock changes a CronJob's Job spec only by its podFailurePolicy rule (exit 75 of
      cronlock-gate) and suspend (set under policy: queue, removed with it), and its
      templates' metadata only by the label cronlock.io/lock
    reason: Forbidden
  - expression: >-
      variables.resource != "cronjobs" || (
      {{- range $i, $field := $podFields }}{{ if $i }} &&{{ end }}
      variables.newPod.?{{ $field }}.orValue(null) == variables.oldPod.?{{ $field }}.orValue(null)
      {{- end }})
    message: >-
      cronlock never changes the account a CronJob's pods run as, their security context,
      host namespaces, placement, runtime or any other pod field injection does not write
    reason: Forbidden
  # The three pod fields injection does write, and only as it writes them: restartPolicy to
  # Never, the grace period shortened, shareProcessNamespace on; or back as recorded (a
  # grace the user never wrote comes back as the API server's default, 30).
  - expression: >-
      variables.resource != "cronjobs" || (
      (variables.newPod.?restartPolicy.orValue("") == variables.oldPod.?restartPolicy.orValue("") ||
      variables.newPod.?restartPolicy.orValue("") == "Never" ||
      variables.newPod.?restartPolicy.orValue("") ==
      variables.oldNotes[?"cronlock.io/original-restart-policy"].orValue("-")) &&
      (variables.newPod.?terminationGracePeriodSeconds.orValue(-1) ==
      variables.oldPod.?terminationGracePeriodSeconds.orValue(-1) ||
      (has(variables.newPod.terminationGracePeriodSeconds) &&
      (!has(variables.oldPod.terminationGracePeriodSeconds) ||
      variables.newPod.terminationGracePeriodSeconds < variables.oldPod.terminationGracePeriodSeconds ||
      variables.newPod.terminationGracePeriodSeconds <= variables.originalGrace))) &&
      (variables.newPod.?shareProcessNamespace.orValue(null) ==
      variables.oldPod.?shareProcessNamespace.orValue(null) ||
      variables.newPod.?shareProcessNamespace.orValue(false) == true ||
      "cronlock.io/original-share-process-namespace" in variables.oldNotes))
    message: >-
      cronlock changes restartPolicy only to Never, terminationGracePeriodSeconds only
      down, shareProcessNamespace only to true, or each back as its cronlock.io/original-*
      annotation recorded
    reason: Forbidden
  # The user's containers: the same ones, each as it was but for cronlock's read-only mount,
  # for a lock in a store the success volume's writable mount (where the work says its tick
  # succeeded), and cronlock's liveness probe (GET /held on the sidecar's port, nothing else).
  - expression: >-
      variables.resource != "cronjobs" || (variables.userContainersKept &&
      variables.newUserContainers.all(c, variables.oldUserContainers.exists(o, o.name == c.name
      {{- range $containerFields }} &&
      c.?{{ . }}.orValue(null) == o.?{{ . }}.orValue(null)
      {{- end }} &&
      c.?volumeMounts.orValue([]).filter(m, !(m.name in ["cronlock", "cronlock-success"])) ==
      o.?volumeMounts.orValue([]).filter(m, !(m.name in ["cronlock", "cronlock-success"])) &&
      c.?volumeMounts.orValue([]).all(m, m.name != "cronlock" ||
      (m.mountPath == "/var/run/cronlock" && m.?readOnly.orValue(false) == true &&
      !has(m.subPath) && !has(m.subPathExpr) && !has(m.mountPropagation))) &&
      c.?volumeMounts.orValue([]).all(m, m.name != "cronlock-success" ||
      (m.mountPath == "/var/run/cronlock-success" &&
      variables.newNotes[?"cronlock.io/store"].orValue("lease") in ["redis", "postgres"] &&
      !has(m.subPath) && !has(m.subPathExpr) && !has(m.mountPropagation))) &&
      (c.?livenessProbe.orValue(null) == o.?livenessProbe.orValue(null) ||
      [c, o].exists(x, has(x.livenessProbe) && has(x.livenessProbe.httpGet) &&
      x.livenessProbe.httpGet.?path.orValue("") == "/held" &&
      x.livenessProbe.httpGet.port == 8484 && !has(x.livenessProbe.httpGet.host) &&
      !has(x.livenessProbe.httpGet.httpHeaders) &&
      (x == c || !has(c.livenessProbe)))))))
    message: >-
      cronlock never changes the image of a container it did not add, nor its command,
      environment, security context or any other field but its read-only cronlock mount,
      for a lock in a store its cronlock-success mount, and its /held liveness probe, and
      it never adds or removes one
    reason: Forbidden
  # cronlock's own containers: the configured sidecar image (the sidecar may run the stores
  # image), its two commands, restricted security, only the cronlock volume (and the
  # sidecar the store's, read-only), only CRONLOCK_* variables from values or the pod's own
  # fields.
  - expression: >-
      variables.resource != "cronjobs" || variables.newInjected.all(c,
      ({{ include "cronlock.admitsImage" (dict "image" $root.Values.sidecarImage "root" $root "expr" "c.?image.orValue(\"\")") }}
      {{- if include "cronlock.sidecarStoresImage" $root }} ||
      (c.name == "cronlock" && {{ include "cronlock.admitsImage" (dict "image" $root.Values.sidecarStoresImage "root" $root "expr" "c.?image.orValue(\"\")") }} &&
       variables.newNotes[?"cronlock.io/store"].orValue("lease") in ["redis", "postgres"])
      {{- end }}) &&
      c.?command.orValue([]) == (c.name == "cronlock" ? ["cronlock-sidecar", "hold"] : ["cronlock-sidecar", "gate"]) &&
      c.?restartPolicy.orValue("") == (c.name == "cronlock" ? "Always" : "")
      {{- range $injectedNever }} &&
      !has(c.{{ . }})
      {{- end }} &&
      c.?env.orValue([]).all(e, e.name in variables.injectedEnv && (!has(e.valueFrom) ||
      (has(e.valueFrom.fieldRef) && e.valueFrom.fieldRef.fieldPath.startsWith("metadata.")))) &&
      c.?env.orValue([]).all(e,
      (e.name != "CRONLOCK_LEASE" || e.?value.orValue("").startsWith(request.namespace + "/cronlock-")) &&
      (e.name != "CRONLOCK_POLICY" || e.?value.orValue("") ==
        variables.newNotes[?"cronlock.io/policy"].orValue({{ $root.Values.defaults.policy | quote }})) &&
      (e.name != "CRONLOCK_STOP" || e.?value.orValue("") in ["liveness", "signal"]) &&
      (e.name != "CRONLOCK_STORE_FILE" || e.?value.orValue("") == "/var/run/cronlock-store/url") &&
      (e.name != "CRONLOCK_STORE_KIND" || e.?value.orValue("") ==
        variables.newNotes[?"cronlock.io/store"].orValue(""))) &&
      c.?ports.orValue([]).all(p, !has(p.hostPort) && !has(p.hostIP)) &&
      c.?volumeMounts.orValue([]).all(m, ((m.name == "cronlock" && m.mountPath == "/var/run/cronlock") ||
      (c.name == "cronlock" && m.name == "cronlock-store" && m.mountPath == "/var/run/cronlock-store" &&
      m.?readOnly.orValue(false) == true) ||
      (c.name == "cronlock" && m.name == "cronlock-success" && m.mountPath == "/var/run/cronlock-success" &&
      m.?readOnly.orValue(false) == true)) &&
      !has(m.subPath) && !has(m.subPathExpr) && !has(m.mountPropagation)) &&
      has(c.securityContext) &&
      c.securityContext.?runAsNonRoot.orValue(false) == true &&
      c.securityContext.?runAsUser.orValue(1) > 0 &&
      c.securityContext.?runAsGroup.orValue(1) > 0 &&
      c.securityContext.?privileged.orValue(false) == false &&
      c.securityContext.?allowPrivilegeEscalation.orValue(true) == false &&
      c.securityContext.?readOnlyRootFilesystem.orValue(false) == true &&
      c.securityContext.?capabilities.?drop.orValue([]) == ["ALL"] &&
      !has(c.securityContext.capabilities.add) &&
      c.securityContext.?seccompProfile.?type.orValue("") == "RuntimeDefault"
      {{- range $securityNever }} &&
      !has(c.securityContext.{{ . }})
      {{- end }})
    message: >-
      cronlock's containers (cronlock, cronlock-gate) run only the configured sidecar image
      ({{ include "cronlock.sidecarImage" $root }}
      {{- with include "cronlock.sidecarStoresImage" $root }}; the sidecar also {{ . }}{{ end }}
      {{- if or $root.Values.sidecarImage.digest $root.Values.sidecarStoresImage.digest }};
      by digest from any repository{{ end }})
      with its own command, restricted security and the cronlock volume alone (the sidecar
      also the store's Secret and the success volume, read-only)
    reason: Forbidden
  # Who the sidecar is and which Lease it holds (security review 2026-12-05, L2 residue):
  # its identity from the pod's own fields, the CronJob's own lock, a version the skew
  # check can read. An environment kept as it was (an injection by an earlier release,
  # while only annotations change) is left alone: the writer added nothing to it.
  - expression: >-
      variables.resource != "cronjobs" || variables.newInjected.all(c,
      variables.oldPod.?initContainers.orValue([]).exists(o, o.name == c.name &&
        o.?env.orValue([]) == c.?env.orValue([])) || c.?env.orValue([]).all(e,
      (e.name in variables.podFieldEnv ?
        (!has(e.value) && has(e.valueFrom) && has(e.valueFrom.fieldRef) &&
         e.valueFrom.fieldRef.fieldPath == variables.podFieldEnv[e.name]) :
        !has(e.valueFrom)) &&
      (e.name != "CRONLOCK_LEASE" || e.?value.orValue("") == variables.lease) &&
      (e.name != "CRONLOCK_CRONJOB" || e.?value.orValue("") == object.metadata.name) &&
      (e.name != "CRONLOCK_OPERATOR_VERSION" || e.?value.orValue("").matches(
        "^[0-9]{1,6}[.][0-9]{1,6}([.][0-9]{1,6})?(-[0-9A-Za-z.-]{1,64})?([+][0-9A-Za-z.-]{1,64})?$"))))
    message: >-
      cronlock's sidecar takes CRONLOCK_POD_NAME, _POD_UID, _POD_NAMESPACE and _JOB_NAME
      only from the pod's own fields (metadata.name, metadata.uid, metadata.namespace, the
      label batch.kubernetes.io/job-name), CRONLOCK_LEASE only as the CronJob's own lock
      Lease (<namespace>/cronlock-<cronlock.io/lock, or the CronJob's name>) and
      CRONLOCK_OPERATOR_VERSION only as a version (MAJOR.MINOR[.PATCH][-PRE][+BUILD])
    reason: Forbidden
  # Volumes: the user's as they were; cronlock's is an emptyDir, a store's is the one key
  # "url" of the Secret the CronJob's own cronlock.io/store-secret names, and the success
  # volume of a lock in a store an emptyDir.
  - expression: >-
      variables.resource != "cronjobs" || (
      variables.newPod.?volumes.orValue([]).filter(v, !(v.name in ["cronlock", "cronlock-store", "cronlock-success"])) ==
      variables.oldPod.?volumes.orValue([]).filter(v, !(v.name in ["cronlock", "cronlock-store", "cronlock-success"])) &&
      variables.newPod.?volumes.orValue([]).all(v, v.name != "cronlock" || has(v.emptyDir)) &&
      variables.newPod.?volumes.orValue([]).all(v, v.name != "cronlock-success" || (has(v.emptyDir) &&
      variables.newNotes[?"cronlock.io/store"].orValue("lease") in ["redis", "postgres"])) &&
      variables.newPod.?volumes.orValue([]).all(v, v.name != "cronlock-store" || (has(v.secret) &&
      v.secret.?secretName.orValue("") == variables.newNotes[?"cronlock.io/store-secret"].orValue("") &&
      v.secret.?items.orValue([]).size() == 1 && v.secret.items[0].key == "url" &&
      v.secret.items[0].path == "url" && !has(v.secret.items[0].mode))))
    message: >-
      cronlock adds only its own emptyDir volume and, for a lock in Redis or PostgreSQL, the
      key url of the Secret named by the CronJob's cronlock.io/store-secret and the
      cronlock-success emptyDir, and never changes another volume
    reason: Forbidden
{{- end }}
