"""`cronlock lint`'s rules on annotation values, written as the CEL of the chart's
ValidatingAdmissionPolicy, so that `kubectl apply` and a GitOps sync print the reason.

The chart's template (charts/cronlock/templates/annotation-policy.yaml) is this module's
output, never edited by hand: `python -m cronlock_operator.lint.admission` writes it, and
tests/unit/test_annotation_policy.py fails when the checked-in file differs. Every bound,
name list and pattern below is read from the operator's own rules (cronjob.config,
cronjob.timing, cronjob.defaults, cronjob.policies, leases.sharing, the contract, lock.permits), and
tests/integration/test_annotation_policy.py applies a corpus of good and bad values on the
real API server and compares the policy's verdict with `cronlock lint`'s.

What CEL cannot judge stays with lint and the reconciler's Events: rules that read the
pod's containers (a livenessProbe of their own under stop: liveness or auto), the TTL
against the schedule, and the consent of CronJobs sharing one lock.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from cronlock_operator.cronjob import config, defaults, policies, timing
from cronlock_operator.cronjob.podspec import DEFAULT_SERVICE_ACCOUNT
from cronlock_operator.leases import sharing
from cronlock_sidecar import contract
from cronlock_sidecar.lock import durations, maxhold, model
from cronlock_sidecar.lock import permits as permits_model

TEMPLATE: Final = "charts/cronlock/templates/annotation-policy.yaml"
# Every message starts so: a user (or a test) tells cronlock's warnings from others'.
MESSAGE_PREFIX: Final = "cronlock:"
# How much of a value a message quotes: an annotation may be 256 KiB.
QUOTED: Final = 64

_DURATION: Final = f"^(0|({durations._PART_PATTERN})+)$"
_NAME: Final = f"^({config._LOCK.pattern})$"
_PEER: Final = f"^({sharing._NAME.pattern})$"
_COUNT: Final = f"^{permits_model._COUNT.pattern}"
_MIN_TTL: Final = timing.minimum_ttl_seconds(contract.DEFAULT_SKEW_SECONDS)
_STOPS: Final = ("liveness", "signal", "auto")


@dataclass(frozen=True)
class Rule:
    """One validation: `expression` holds for a good CronJob, `message` (CEL) says why not."""

    annotation: str
    expression: str
    message: str


def _variable(key: str) -> str:
    """The CEL variable holding an annotation's text: cronlock.io/wait-timeout, waitTimeout."""
    first, *rest = key.removeprefix(contract.PREFIX).split("-")
    return first + "".join(word.capitalize() for word in rest)


def _text(key: str) -> str:
    return f"variables.{_variable(key)}"


def _set(key: str) -> str:
    return f'"{key}" in variables.notes'


def _quoted(key: str) -> str:
    value = _text(key)
    return (
        f'"{key}: \\"" + ({value}.size() > {QUOTED} ? {value}.substring(0, {QUOTED}) + "…" : '
        f'{value}) + "\\" "'
    )


def _cel_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(json.dumps(item) for item in items) + "]"


def _duration_ok(key: str) -> str:
    return f"{_text(key)}.trim().matches(r'{_DURATION}')"


def _duration(key: str) -> str:
    return f"duration({_text(key)}.trim())"


def rules() -> list[Rule]:
    """The validations, in the order the operator checks the annotations."""
    ttl, renew = contract.ANNOTATION_TTL, contract.ANNOTATION_RENEW
    wait, policy = contract.ANNOTATION_WAIT_TIMEOUT, contract.ANNOTATION_POLICY
    jitter = contract.ANNOTATION_JITTER
    queue = contract.ANNOTATION_QUEUE_TIMEOUT
    store, secret = contract.ANNOTATION_STORE, contract.ANNOTATION_STORE_SECRET
    known = _cel_list(sorted(contract.USER_SETTINGS | contract.OPERATOR_OWNED))
    forms = durations.DURATION_FORMS
    denominator = model.RENEW_DEADLINE_DENOMINATOR
    alert, missed = contract.ANNOTATION_ALERT_AFTER, contract.ANNOTATION_ALERT_AFTER_MISSED
    peers, permits = contract.ANNOTATION_SHARE_LOCK_WITH, contract.ANNOTATION_PERMITS
    return [
        Rule(
            "(any)",
            f'variables.notes.all(k, !k.startsWith("{contract.PREFIX}") || k in {known})',
            f'variables.notes.filter(k, k.startsWith("{contract.PREFIX}") && !(k in '
            f'{known})).join(", ") + " is not a cronlock annotation; expected one '
            f'of {", ".join(sorted(contract.USER_SETTINGS))}"',
        ),
        _one_of(contract.ANNOTATION_ENABLED, ("true", "false")),
        _one_of(store, contract.STORES),
        Rule(
            secret,
            f'!({_set(secret)}) || {_text(store)} in ["redis", "postgres"]',
            f"\"{secret} names a store's Secret, but the lock is a Lease; set {store} to "
            f'redis or postgres, or remove it (docs/STORES.md)"',
        ),
        Rule(
            store,
            f'!({_text(store)} in ["redis", "postgres"]) || {_set(secret)}',
            f'{_quoted(store)} + "needs {secret}: the name of a Secret in this namespace '
            f"whose key '{contract.STORE_SECRET_URL_KEY}' holds the store's URL "
            f'(docs/STORES.md)"',
        ),
        Rule(
            secret,
            f"!({_set(secret)}) || ({_text(secret)}.size() <= {config._MAX_SECRET_NAME_LENGTH} "
            f"&& {_text(secret)}.matches(r'{_NAME}'))",
            f'{_quoted(secret)} + "is not a Secret name; expected at most '
            f"{config._MAX_SECRET_NAME_LENGTH} lowercase letters, digits, '-' and '.', "
            f'starting and ending with a letter or digit"',
        ),
        Rule(
            contract.ANNOTATION_LOCK,
            f"!({_set(contract.ANNOTATION_LOCK)}) || "
            f"({_text(contract.ANNOTATION_LOCK)}.size() <= {config._MAX_LOCK_LENGTH} && "
            f"{_text(contract.ANNOTATION_LOCK)}.matches(r'{_NAME}'))",
            f'{_quoted(contract.ANNOTATION_LOCK)} + "is not a lock name; expected at most '
            f"{config._MAX_LOCK_LENGTH} lowercase letters, digits, '-' and '.', starting "
            f'and ending with a letter or digit"',
        ),
        Rule(
            ttl,
            f"!({_set(ttl)}) || {_duration_ok(ttl)}",
            f'{_quoted(ttl)} + "is not a duration; expected {forms}"',
        ),
        Rule(
            ttl,
            f"!({_set(ttl)}) || !({_duration_ok(ttl)}) || "
            f'({_duration(ttl)} >= duration("{timing.MIN_TTL_SECONDS}s") && '
            f'{_duration(ttl)} <= duration("{timing.MAX_TTL_SECONDS}s"))',
            f'{_quoted(ttl)} + "is out of range; expected a duration from '
            f'{timing.MIN_TTL_SECONDS}s to 24h"',
        ),
        Rule(
            ttl,
            f"!({_set(ttl)}) || !({_duration_ok(ttl)}) || "
            f'{_duration(ttl)} == duration(string({_duration(ttl)}.getSeconds()) + "s")',
            f"{_quoted(ttl)} + \"is not a whole number of seconds, which the Lease's "
            f'leaseDurationSeconds needs"',
        ),
        Rule(
            ttl,
            f"!({_set(ttl)}) || !({_duration_ok(ttl)}) || "
            f'{_duration(ttl)} < duration("{timing.MIN_TTL_SECONDS}s") || '
            f'{_duration(ttl)} >= duration("{_MIN_TTL}s")',
            f'{_quoted(ttl)} + "is too short to stop a run that lost its lease before another '
            f"run may take it (renew deadline, probe, kill grace and clock skew must stay "
            f'under the ttl); use a ttl of at least {_MIN_TTL}s"',
        ),
        Rule(
            renew,
            f"!({_set(renew)}) || {_duration_ok(renew)}",
            f'{_quoted(renew)} + "is not a duration; expected {forms}"',
        ),
        Rule(
            renew,
            f"!({_set(renew)}) || !({_duration_ok(renew)}) || !variables.ttlOk || "
            f'({_duration(renew)} < variables.ttlDuration && {_duration(renew)} >= duration("'
            f'{timing.MIN_RENEW_SECONDS:g}s") && {_duration(renew)}.getMilliseconds() * '
            f"{denominator} <= variables.ttlDuration.getMilliseconds())",
            f'{_quoted(renew)} + "is too long or too short for a ttl of " + '
            f'string(variables.ttlDuration.getSeconds()) + "s: renew at least every '
            f"{timing.MIN_RENEW_SECONDS:g}s and at most every third of the ttl, so that two "
            f'renewal attempts fit in the renew deadline (2/3 of the ttl)"',
        ),
        _one_of(policy, contract.POLICIES),
        Rule(
            contract.ANNOTATION_WAIT_TIMEOUT,
            f"!({_set(wait)}) || {_duration_ok(wait)}",
            f'{_quoted(wait)} + "is not a duration; expected {forms}"',
        ),
        Rule(
            wait,
            f"!({_set(wait)}) || !({_duration_ok(wait)}) || "
            f'{_duration(wait)} <= duration("{policies.MAX_WAIT_TIMEOUT_SECONDS}s")',
            f'{_quoted(wait)} + "is out of range; expected at most 24h"',
        ),
        Rule(
            wait,
            f"!({_set(wait)}) || !({_duration_ok(wait)}) || "
            f'{_duration(wait)} == duration("0s") || '
            f'variables.notes[?"{policy}"].orValue(variables.defaultPolicy) in ["wait", "replace"]',
            f'{_quoted(wait)} + "only applies with {policy}: \\"wait\\" or \\"replace\\"; '
            f'with another policy a run never waits for the lock"',
        ),
        Rule(
            queue,
            f"!({_set(queue)}) || {_duration_ok(queue)}",
            f'{_quoted(queue)} + "is not a duration; expected {forms}"',
        ),
        Rule(
            queue,
            f"!({_set(queue)}) || !({_duration_ok(queue)}) || "
            f'({_duration(queue)} >= duration("{policies.MIN_QUEUE_TIMEOUT_SECONDS:g}s") && '
            f'{_duration(queue)} <= duration("{policies.MAX_WAIT_TIMEOUT_SECONDS}s"))',
            f'{_quoted(queue)} + "is out of range; expected 1s to 24h (how long a tick may '
            f'stay queued)"',
        ),
        Rule(
            queue,
            f'!({_set(queue)}) || {_text(policy)} == "queue"',
            f'{_quoted(queue)} + "only applies with {policy}: \\"queue\\"; with another '
            f'policy no run is queued"',
        ),
        Rule(
            policy,
            f'{_text(policy)} != "queue" || !({_text(store)} in ["redis", "postgres"])',
            f'"{policy}: \\"queue\\" needs the lock in a Lease ({store}: lease): the '
            f'operator lets a queued Job go when it sees the Lease released"',
        ),
        *_max_hold_rules(),
        Rule(
            jitter,
            f"!({_set(jitter)}) || {_duration_ok(jitter)}",
            f'{_quoted(jitter)} + "is not a duration; expected {forms}"',
        ),
        Rule(
            jitter,
            f"!({_set(jitter)}) || !({_duration_ok(jitter)}) || "
            f'{_duration(jitter)} <= duration("{contract.MAX_JITTER_SECONDS}s")',
            f'{_quoted(jitter)} + "is out of range; expected a duration from 0 (no jitter) to '
            f"1h, the longest a run's pod may wait before it takes its lock\"",
        ),
        _one_of(contract.ANNOTATION_STOP, _STOPS),
        Rule(
            contract.ANNOTATION_STOP,
            f'{_text(contract.ANNOTATION_STOP)} != "signal" || '
            f'!({_text(store)} in ["redis", "postgres"])',
            f'"{contract.ANNOTATION_STOP}: \\"signal\\" cannot be used with {store}: " + '
            f"{_text(store)} + \": the sidecar would share the pod's process namespace and "
            f"your work could read the store's URL and password; set "
            f'{contract.ANNOTATION_STOP}: \\"liveness\\" or keep the lock in the Lease"',
        ),
        Rule(
            store,
            f'!({_text(store)} in ["redis", "postgres"]) || '
            f"!object.spec.jobTemplate.spec.template.spec.?shareProcessNamespace.orValue(false)",
            f'"{store}: " + {_text(store)} + " cannot be used in a pod with '
            f"shareProcessNamespace: true: its containers could read the store's URL and "
            f'password; remove shareProcessNamespace or keep the lock in the Lease"',
        ),
        _number(alert, config.MIN_ALERT_AFTER, config.MAX_ALERT_AFTER, "skips"),
        _number(missed, 0, defaults.MAX_ALERT_AFTER_MISSED, "ticks without a successful run"),
        _one_of(contract.ANNOTATION_KEEP_SKIPPED_JOBS, ("true", "false")),
        Rule(
            permits,
            f"!({_set(permits)}) || ({_text(permits)}.trim().matches(r'{_COUNT}') "
            f"&& int({_text(permits)}.trim()) <= {contract.MAX_PERMITS})",
            f'{_quoted(permits)} + "is not a number of permits; expected a whole number from 1 '
            f'to {contract.MAX_PERMITS} (how many runs may hold the lock at once)"',
        ),
        Rule(
            permits,
            f"!({_set(permits)}) || !({_text(permits)}.trim().matches(r'{_COUNT}')) || "
            f"int({_text(permits)}.trim()) == 1 || "
            f'variables.notes[?"{policy}"].orValue(variables.defaultPolicy) != "replace"',
            f'{_quoted(permits)} + "cannot be used with {policy}: \\"replace\\" yet: which '
            f"of the holders a replacing run should stop is not settled; use skip, wait or "
            f'observe, or remove {permits}"',
        ),
        Rule(
            peers,
            f'!({_set(peers)}) || ({_text(peers)}.split(",").size() <= {sharing.MAX_PEERS} '
            f'&& {_text(peers)}.split(",").all(n, n.trim().size() <= '
            f"{sharing.MAX_NAME_LENGTH} && n.trim().matches(r'{_PEER}')))",
            f'{_quoted(peers)} + "is not a list of at most {sharing.MAX_PEERS} CronJob names of '
            f'this namespace, separated by commas"',
        ),
    ]


def _max_hold_rules() -> list[Rule]:
    """cronlock.io/max-hold: a duration, at most a week, never with policy observe, and at
    least MAX_HOLD_RENEWALS renew periods (the renew the operator would use: annotated,
    else a third of an annotated ttl, else the chart's default renew or a third of its ttl)."""
    bound, policy, renew = (
        contract.ANNOTATION_MAX_HOLD,
        contract.ANNOTATION_POLICY,
        contract.ANNOTATION_RENEW,
    )
    given = f'!({_set(bound)}) || !({_duration_ok(bound)}) || {_duration(bound)} == duration("0s")'
    renewals = maxhold.MAX_HOLD_RENEWALS
    return [
        Rule(
            bound,
            f"!({_set(bound)}) || {_duration_ok(bound)}",
            f'{_quoted(bound)} + "is not a duration; expected {durations.DURATION_FORMS}"',
        ),
        Rule(
            bound,
            f'{given} || {_duration(bound)} <= duration("{maxhold.MAX_HOLD_LONGEST_SECONDS:g}s")',
            f'{_quoted(bound)} + "is out of range; expected at most 168h (7 days), or 0 for no '
            f'bound"',
        ),
        Rule(
            bound,
            f'{given} || variables.notes[?"{policy}"].orValue(variables.defaultPolicy) '
            '!= "observe"',
            f'{_quoted(bound)} + "cannot be used with {policy}: \\"observe\\", which never '
            f'stops a run; use another policy or remove the max-hold"',
        ),
        Rule(
            bound,
            f"{given} || !variables.ttlOk || ({_set(renew)} && !({_duration_ok(renew)})) || "
            f"{_duration(bound)}.getMilliseconds() >= {renewals} * variables.renewMs",
            f'{_quoted(bound)} + "is shorter than {renewals} renew periods (" + '
            f'string({renewals} * variables.renewMs) + "ms); expected at least that, or 0 for '
            f'no bound"',
        ),
    ]


def _one_of(key: str, values: Sequence[str]) -> Rule:
    shown = ", ".join(f'\\"{value}\\"' for value in values)
    return Rule(
        key,
        f"!({_set(key)}) || {_text(key)} in {_cel_list(values)}",
        f'{_quoted(key)} + "is not one of {shown}"',
    )


def _number(key: str, least: int, most: int, what: str) -> Rule:
    digits = len(str(most))
    return Rule(
        key,
        f"!({_set(key)}) || ({_text(key)}.matches(r'^[0-9]{{1,{digits}}}$') && "
        f"int({_text(key)}) >= {least} && int({_text(key)}) <= {most})",
        f'{_quoted(key)} + "is not a number of {what}; expected a whole number from {least} '
        f'to {most}"',
    )


_HEADER: Final = """\
{{- /*
Generated by `python -m cronlock_operator.lint.admission` from the rules of `cronlock lint`
(operator/src/cronlock_operator/lint/admission.py); do not edit: the unit test
tests/unit/test_annotation_policy.py fails when this file differs from its output.

Judges the cronlock.io/* annotations of CronJobs as they are applied, so that kubectl apply
and a GitOps sync print the reason a value is refused (admissionPolicy.annotations: Warn),
or refuse the write (Deny). It judges a CronJob the operator would guard (annotated
cronlock.io/enabled: "true", or in a namespace labelled cronlock.io/enabled=true, not opted
out and not on the ServiceAccount default), on CREATE and on an UPDATE that changes its
cronlock.io/* annotations; never the operator's own writes. ValidatingAdmissionPolicy is GA
since Kubernetes 1.30, the chart's minimum.
*/}}
"""


def render() -> str:
    """The chart template: the policy (rules as validations) and its binding."""
    lines = [
        _HEADER.rstrip("\n"),
        '{{- if ne .Values.admissionPolicy.annotations "Off" }}',
        "apiVersion: admissionregistration.k8s.io/v1",
        "kind: ValidatingAdmissionPolicy",
        "metadata:",
        '  name: {{ include "cronlock.clusterName" . }}-annotations',
        "  labels:",
        '    {{- include "cronlock.labels" . | nindent 4 }}',
        "spec:",
        "  failurePolicy: Fail",
        "  matchConstraints:",
        "    resourceRules:",
        '      - apiGroups: ["batch"]',
        '        apiVersions: ["v1"]',
        '        operations: ["CREATE", "UPDATE"]',
        '        resources: ["cronjobs"]',
        "  matchConditions:",
        # The release's operator injects and reverts, its hooks revert (accounts named
        # <fullname>-…): cronlock's own writes are never judged, nor refused under Deny.
        "    - name: not-the-operator-or-its-hooks",
        "      expression: >-",
        '        request.userInfo.username != "system:serviceaccount:{{ .Release.Namespace }}:'
        '{{ include "cronlock.serviceAccountName" . }}" &&',
        '        !request.userInfo.username.startsWith("system:serviceaccount:'
        '{{ .Release.Namespace }}:{{ include "cronlock.fullname" . }}-")',
        "    - name: not-opted-out",
        "      expression: >-",
        f'        object.metadata.?annotations.orValue({{}})[?"{contract.ANNOTATION_ENABLED}"]'
        '.orValue("") != "false"',
        "    - name: created-or-annotations-changed",
        "      expression: >-",
        '        request.operation == "CREATE" ||',
        "        object.metadata.?annotations.orValue({}).exists(k, "
        f'k.startsWith("{contract.PREFIX}") &&',
        "        oldObject.metadata.?annotations.orValue({})[?k] != "
        "optional.of(object.metadata.annotations[k])) ||",
        "        oldObject.metadata.?annotations.orValue({}).exists(k, "
        f'k.startsWith("{contract.PREFIX}") &&',
        "        !(k in object.metadata.?annotations.orValue({})))",
        "  variables:",
        "    - name: notes",
        "      expression: 'object.metadata.?annotations.orValue({})'",
    ]
    for key in sorted(contract.USER_SETTINGS):
        lines += [
            f"    - name: {_variable(key)}",
            f'      expression: \'variables.notes[?"{key}"].orValue("")\'',
        ]
    lines += [
        # Whom the operator guards (config.opt_in): annotated, or in a namespace labelled
        # for opt-in and on an account of its own. (matchConditions cannot see the
        # namespace.)
        "    - name: guarded",
        "      expression: >-",
        f'        "{contract.ANNOTATION_ENABLED}" in variables.notes ||',
        "        ({{ .Values.namespaceOptIn }} &&",
        f'        namespaceObject.?metadata.?labels.orValue({{}})[?"{contract.ANNOTATION_ENABLED}"]'
        '.orValue("") == "true" &&',
        '        !(object.spec.jobTemplate.spec.template.spec.?serviceAccountName.orValue("") '
        f'in ["", "{DEFAULT_SERVICE_ACCOUNT}"]))',
        "    - name: defaultPolicy",
        "      expression: '{{ .Values.defaults.policy | quote }}'",
        "    - name: ttlDuration",
        "      expression: >-",
        f'        "{contract.ANNOTATION_TTL}" in variables.notes ? '
        f"{_duration(contract.ANNOTATION_TTL)} :",
        "        duration({{ .Values.defaults.ttl | quote }})",
        "    # The ttl a renew is judged against is valid (else its own rules say so).",
        "    - name: ttlOk",
        "      expression: >-",
    ]
    ttl_rules = [rule for rule in rules() if rule.annotation == contract.ANNOTATION_TTL]
    lines.append("        " + " && ".join(f"({rule.expression})" for rule in ttl_rules))
    renew = contract.ANNOTATION_RENEW
    lines += [
        "    # The renew period the operator uses, in milliseconds (read once ttlOk and a set",
        "    # renew's own syntax are checked): annotated, else a third of an annotated ttl,",
        "    # else the chart's default renew, else a third of its default ttl.",
        "    - name: renewMs",
        "      expression: >-",
        f"        {_set(renew)} ? {_duration(renew)}.getMilliseconds() :",
        "        {{- if .Values.defaults.renew }}",
        f'        "{contract.ANNOTATION_TTL}" in variables.notes ? '
        "variables.ttlDuration.getMilliseconds() / 3 :",
        "        duration({{ .Values.defaults.renew | quote }}).getMilliseconds()",
        "        {{- else }}",
        "        variables.ttlDuration.getMilliseconds() / 3",
        "        {{- end }}",
    ]
    lines.append("  validations:")
    for rule in rules():
        lines += [
            "    - expression: >-",
            f"        !variables.guarded || {rule.expression}",
            "      messageExpression: >-",
            f'        "{MESSAGE_PREFIX} " + {rule.message}',
            "      reason: Invalid",
        ]
    lines += [
        "---",
        "apiVersion: admissionregistration.k8s.io/v1",
        "kind: ValidatingAdmissionPolicyBinding",
        "metadata:",
        '  name: {{ include "cronlock.clusterName" . }}-annotations',
        "  labels:",
        '    {{- include "cronlock.labels" . | nindent 4 }}',
        "spec:",
        '  policyName: {{ include "cronlock.clusterName" . }}-annotations',
        "  validationActions: [{{ .Values.admissionPolicy.annotations | quote }}]",
        "  {{- if .Values.watchNamespaces }}",
        "  matchResources:",
        "    namespaceSelector:",
        "      matchExpressions:",
        "        - key: kubernetes.io/metadata.name",
        "          operator: In",
        "          values: {{ toJson .Values.watchNamespaces }}",
        "  {{- end }}",
        "{{- end }}",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Write the chart's template (run from the repository's root)."""
    with open(TEMPLATE, "w", encoding="utf-8") as out:
        out.write(render())
    sys.stdout.write(f"wrote {TEMPLATE}\n")


if __name__ == "__main__":
    main()
