"""What else runs in a user's cluster: other admission controllers, as policies the real API
server evaluates (MutatingAdmissionPolicy, GA since Kubernetes 1.36), each bound to one
namespace only.

- `defaults`: what Kyverno's auto-generated rules do to a namespace's workloads: a label on
  every pod and every CronJob's pod template, and resources on every container of them (the
  init containers too) that lacks them, key by key (`+(cpu)` in Kyverno's words).
- `injector`: a mesh or agent injector: appends its own native sidecar to every pod.
- `arbitrary_uids`: what OpenShift's restricted-v2 SCC admission does: every container of
  every pod runs as one UID of the namespace's range, with group 0.
"""

from __future__ import annotations

from typing import Any

from tests.support.node import BUSYBOX_IMAGE

LABEL = "neighbour.example/tier"
INJECTED = "neighbour-agent"
DEFAULT_LIMITS = {"cpu": "250m", "memory": "96Mi"}
DEFAULT_REQUESTS = {"cpu": "20m", "memory": "48Mi"}


def _policy(
    name: str, namespace: str, resources: list[dict[str, Any]], mutations: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """A MutatingAdmissionPolicy and its binding to `namespace` alone."""
    group = "admissionregistration.k8s.io/v1"
    full = f"{name}-{namespace}"[:63].rstrip("-")
    return [
        {
            "apiVersion": group,
            "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": full},
            "spec": {
                "failurePolicy": "Fail",
                "reinvocationPolicy": "IfNeeded",
                "matchConstraints": {"resourceRules": resources},
                "mutations": mutations,
            },
        },
        {
            "apiVersion": group,
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": {"name": full},
            "spec": {
                "policyName": full,
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        },
    ]


PODS = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
CRONJOBS = {
    "apiGroups": ["batch"],
    "apiVersions": ["v1"],
    "operations": ["CREATE", "UPDATE"],
    "resources": ["cronjobs"],
}


MAX_CONTAINERS = 4  # per list: the policy looks at this many of each (the tests' pods: 3)


def _resources_patches(path: str, spec: str) -> str:
    """CEL: the JSON patches that give each container of pod spec `spec` (at JSON pointer
    `path`) each request and limit it lacks; what it sets already stays."""
    wanted = {"requests": DEFAULT_REQUESTS, "limits": DEFAULT_LIMITS}

    def patch(at: str, value: str) -> str:
        return f"[JSONPatch{{op: 'add', path: '{at}', value: {value}}}]"

    def amounts(kind: str) -> str:
        return "{" + ", ".join(f"{r!r}: {a!r}" for r, a in wanted[kind].items()) + "}"

    parts = []
    for key in ("initContainers", "containers"):
        for index in range(MAX_CONTAINERS):
            c, at = f"{spec}.{key}[{index}]", f"{path}/{key}/{index}/resources"
            kinds = []
            for kind in wanted:
                each = " + ".join(
                    f"({resource!r} in {c}.resources.{kind} ? [] : "
                    f"{patch(f'{at}/{kind}/{resource}', repr(amount))})"
                    for resource, amount in wanted[kind].items()
                )
                kinds.append(
                    f"(has({c}.resources.{kind}) ? {each} : {patch(f'{at}/{kind}', amounts(kind))})"
                )
            whole = "{" + ", ".join(f"{kind!r}: {amounts(kind)}" for kind in wanted) + "}"
            parts.append(
                f"(size({spec}.?{key}.orValue([])) <= {index} ? [] : "
                f"!has({c}.resources) ? {patch(at, whole)} : {' + '.join(kinds)})"
            )
    return " + ".join(parts)


def _apply(expression: str) -> dict[str, Any]:
    return {"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": expression}}


def _json_patch(expression: str) -> dict[str, Any]:
    return {"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}


def defaults(namespace: str) -> list[dict[str, Any]]:
    """Kyverno-like defaults for the namespace's pods and CronJob templates."""
    label = f"{{{LABEL!r}: 'batch'}}"
    template = "Object.spec.jobTemplate.spec.template"
    cronjob_label = (
        "Object{spec: Object.spec{jobTemplate: Object.spec.jobTemplate{"
        f"spec: Object.spec.jobTemplate.spec{{template: {template}{{"
        f"metadata: {template}.metadata{{labels: {label}}}}}}}}}}}}}"
    )
    cronjob_resources = _resources_patches("/spec/jobTemplate/spec/template/spec", "variables.s")
    pod_label = f"Object{{metadata: Object.metadata{{labels: {label}}}}}"
    pod_resources = _resources_patches("/spec", "variables.s")
    cronjobs = _policy(
        "neighbour-defaults-cronjobs",
        namespace,
        [CRONJOBS],
        [_apply(cronjob_label), _json_patch(cronjob_resources)],
    )
    cronjobs[0]["spec"]["variables"] = [
        {"name": "s", "expression": "object.spec.jobTemplate.spec.template.spec"}
    ]
    pods = _policy(
        "neighbour-defaults-pods",
        namespace,
        [PODS],
        [_apply(pod_label), _json_patch(pod_resources)],
    )
    pods[0]["spec"]["variables"] = [{"name": "s", "expression": "object.spec"}]
    return [*cronjobs, *pods]


def injector(namespace: str) -> list[dict[str, Any]]:
    """An injector appending its own native sidecar (restartPolicy Always) to every pod."""
    sidecar = (
        "Object.spec.initContainers{"
        f"name: {INJECTED!r}, image: {BUSYBOX_IMAGE!r}, imagePullPolicy: 'Never', "
        "command: ['sh', '-c', 'trap \"exit 0\" TERM; while true; do sleep 1; done'], "
        "restartPolicy: 'Always', "
        "resources: Object.spec.initContainers.resources{"
        "requests: {'cpu': '5m', 'memory': '8Mi'}, "
        "limits: {'memory': '16Mi'}}, "
        "securityContext: Object.spec.initContainers.securityContext{"
        "runAsNonRoot: true, runAsUser: 65534, allowPrivilegeEscalation: false, "
        "capabilities: Object.spec.initContainers.securityContext.capabilities{drop: ['ALL']}, "
        "seccompProfile: Object.spec.initContainers.securityContext.seccompProfile{"
        "type: 'RuntimeDefault'}}}"
    )
    # A JSON patch: an apply configuration may not set a container's command (atomic).
    mutation = _json_patch(
        "has(object.spec.initContainers) ? "
        f"[JSONPatch{{op: 'add', path: '/spec/initContainers/-', value: {sidecar}}}] : "
        f"[JSONPatch{{op: 'add', path: '/spec/initContainers', value: [{sidecar}]}}]"
    )
    policy = _policy("neighbour-injector", namespace, [PODS], [mutation])
    policy[0]["spec"]["matchConditions"] = [
        {
            "name": "not-yet-injected",
            "expression": (
                f"!object.spec.?initContainers.orValue([]).exists(c, c.name == {INJECTED!r})"
            ),
        }
    ]
    return policy


def arbitrary_uids(namespace: str, uid: int) -> list[dict[str, Any]]:
    """restricted-v2's admission: every container's runAsUser is `uid`, its group 0."""
    items = []
    for key in ("initContainers", "containers"):
        item = f"Object.spec.{key}"
        items.append(
            f"{key}: object.spec.?{key}.orValue([]).map(c, {item}{{name: c.name, "
            f"securityContext: {item}.securityContext{{runAsUser: {uid}, runAsGroup: 0}}}})"
        )
    mutation = _apply(f"Object{{spec: Object.spec{{{', '.join(items)}}}}}")
    return _policy("neighbour-uids", namespace, [PODS], [mutation])


def restricted_pod(namespace: str, name: str) -> dict[str, Any]:
    """A pod as a user writes it for a `restricted` namespace on such a platform: no UID."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": name,
                    "image": BUSYBOX_IMAGE,
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }
