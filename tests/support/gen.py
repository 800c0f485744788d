"""One builder per kind, changed by modifiers (cert-manager's `test/unit/gen`): a test says
what it needs of an object and nothing else, `gen.cronjob("report", gen.annotated(...))`.

A builder returns a fresh dict, the object as a user writes it (the API server's view is
`cronjobs.server_defaults`); a modifier is a function that changes such a dict, applied in
the order given. Leases are not built here: `leases.make_lease` has the lock model write
them, so their shape is the code's own.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping
from typing import Any

Modifier = Callable[[dict[str, Any]], None]

_VERSIONS = itertools.count(1)

# A CronJob that never comes due of itself: integration tests make their Jobs by hand.
NEVER = "0 0 1 1 *"
OPTED_IN = {"cronlock.io/enabled": "true"}


def cronjob(name: str = "report", *modifiers: Modifier) -> dict[str, Any]:
    """A CronJob `name` in `team-a`, opted in, every five minutes, one busybox container
    that exits 0 (restartPolicy OnFailure), then each modifier in turn."""
    body: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name, "namespace": "team-a", "annotations": dict(OPTED_IN)},
        "spec": {
            "schedule": "*/5 * * * *",
            "jobTemplate": {
                "spec": {
                    "template": {
                        "spec": {
                            "restartPolicy": "OnFailure",
                            "containers": [
                                {"name": "main", "image": "busybox:1.36", "command": ["true"]}
                            ],
                        }
                    }
                }
            },
        },
    }
    for modify in modifiers:
        modify(body)
    return body


def _pod_spec(body: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = body["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return spec


def _first(mapping: dict[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    """`fields` ahead of the rest of `mapping` (which they override), as users write them:
    `backoffLimit` before `template`, `suspend` before `jobTemplate`."""
    return {**fields, **{key: value for key, value in mapping.items() if key not in fields}}


def in_namespace(namespace: str | None) -> Modifier:
    """In `namespace`; None leaves it out, for a CronJob created through the API."""

    def modify(body: dict[str, Any]) -> None:
        if namespace is None:
            body["metadata"].pop("namespace", None)
        else:
            body["metadata"]["namespace"] = namespace

    return modify


def with_annotations(notes: Mapping[str, str]) -> Modifier:
    """Exactly these annotations (`{}`: none, so not opted in)."""

    def modify(body: dict[str, Any]) -> None:
        body["metadata"]["annotations"] = dict(notes)

    return modify


def annotated(notes: Mapping[str, str]) -> Modifier:
    """These annotations besides those it has."""

    def modify(body: dict[str, Any]) -> None:
        body["metadata"]["annotations"].update(notes)

    return modify


def not_opted_in() -> Modifier:
    """No annotations at all: the operator leaves it alone."""
    return with_annotations({})


def in_store(store: str, secret: str) -> Modifier:
    """Its lock kept in `store` (redis, postgres) reached through the Secret `secret`."""
    return annotated({"cronlock.io/store": store, "cronlock.io/store-secret": secret})


def labelled(labels: Mapping[str, str]) -> Modifier:
    def modify(body: dict[str, Any]) -> None:
        body["metadata"].setdefault("labels", {}).update(labels)

    return modify


def with_uid(uid: str) -> Modifier:
    """The uid the API server gave it."""

    def modify(body: dict[str, Any]) -> None:
        body["metadata"]["uid"] = uid

    return modify


def with_metadata(**fields: Any) -> Modifier:
    """Other metadata (creationTimestamp, managedFields, ...)."""

    def modify(body: dict[str, Any]) -> None:
        body["metadata"].update(fields)

    return modify


def with_schedule(schedule: str) -> Modifier:
    def modify(body: dict[str, Any]) -> None:
        body["spec"]["schedule"] = schedule

    return modify


def never_due() -> Modifier:
    """Scheduled once a year (`NEVER`): its Jobs are only those a test makes."""
    return with_schedule(NEVER)


def with_spec(**fields: Any) -> Modifier:
    """Fields of the CronJob's own spec (`suspend`, `concurrencyPolicy`, ...)."""

    def modify(body: dict[str, Any]) -> None:
        body["spec"] = {"schedule": body["spec"]["schedule"], **_first(body["spec"], fields)}

    return modify


def with_status(status: Mapping[str, Any]) -> Modifier:
    def modify(body: dict[str, Any]) -> None:
        body["status"] = copy.deepcopy(dict(status))

    return modify


def with_job(**fields: Any) -> Modifier:
    """Fields of the Job's spec (`backoffLimit`, `podFailurePolicy`, ...)."""

    def modify(body: dict[str, Any]) -> None:
        template = body["spec"]["jobTemplate"]
        template["spec"] = _first(template["spec"], fields)

    return modify


def with_job_labels(labels: Mapping[str, str]) -> Modifier:
    """Labels on the Job template."""

    def modify(body: dict[str, Any]) -> None:
        template = body["spec"]["jobTemplate"]
        template.setdefault("metadata", {}).setdefault("labels", {}).update(labels)

    return modify


def with_pod(**fields: Any) -> Modifier:
    """Fields of the pod's spec (`securityContext`, `nodeSelector`, `volumes`, ...)."""

    def modify(body: dict[str, Any]) -> None:
        _pod_spec(body).update(fields)

    return modify


def restart_policy(policy: str) -> Modifier:
    return with_pod(restartPolicy=policy)


def service_account(name: str) -> Modifier:
    return with_pod(serviceAccountName=name)


def containers(*specs: Mapping[str, Any]) -> Modifier:
    """These containers instead of the one busybox."""

    def modify(body: dict[str, Any]) -> None:
        _pod_spec(body)["containers"] = [copy.deepcopy(dict(spec)) for spec in specs]

    return modify


def next_version() -> str:
    """A resourceVersion no object here had before."""
    return str(next(_VERSIONS))


def as_stored() -> Modifier:
    """As the API server stores it: defaults filled into every container and probe, and a
    resourceVersion of its own (the API server never gives two contents one)."""

    def modify(stored: dict[str, Any]) -> None:
        stored["metadata"].setdefault("resourceVersion", next_version())
        job_template = stored["spec"]["jobTemplate"]
        # ObjectMeta is a struct: Go's omitempty never leaves it out.
        job_template.setdefault("metadata", {})
        job_template["spec"]["template"].setdefault("metadata", {})
        spec = _pod_spec(stored)
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("securityContext", {})
        spec.setdefault("terminationGracePeriodSeconds", 30)
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            container.setdefault("imagePullPolicy", "IfNotPresent")
            container.setdefault("resources", {})
            for port in container.get("ports", []):
                port.setdefault("protocol", "TCP")
            for variable in container.get("env", []):
                field_ref = variable.get("valueFrom", {}).get("fieldRef")
                if field_ref is not None:
                    field_ref.setdefault("apiVersion", "v1")
            for probe_name in ("livenessProbe", "readinessProbe", "startupProbe"):
                probe = container.get(probe_name)
                if probe is None:
                    continue
                probe.setdefault("timeoutSeconds", 1)
                probe.setdefault("periodSeconds", 10)
                probe.setdefault("successThreshold", 1)
                probe.setdefault("failureThreshold", 3)
                if "httpGet" in probe:
                    probe["httpGet"].setdefault("scheme", "HTTP")

    return modify


def on_the_node(image: str, script: str, *env: Mapping[str, Any]) -> Modifier:
    """A run on the real node: one container `main` of `image`, preloaded there (never
    pulled), running `sh -c script` with `env` as UID 65532; its pod is not restarted and
    its Job not retried."""

    def modify(body: dict[str, Any]) -> None:
        main: dict[str, Any] = {"name": "main", "image": image, "imagePullPolicy": "Never"}
        if env:
            main["env"] = [dict(variable) for variable in env]
        main["command"] = ["sh", "-c", script]
        for step in (
            restart_policy("Never"),
            with_job(backoffLimit=0),
            with_pod(securityContext={"runAsNonRoot": True, "runAsUser": 65532}),
            containers(main),
        ):
            step(body)

    return modify


def job(name: str, *modifiers: Modifier) -> dict[str, Any]:
    """A Job `name` as the API server returns it (uid `uid-<name>`), a pod template with no
    containers said, then each modifier in turn (`in_namespace`, `with_uid`, `labelled`,
    `with_metadata` apply to it as to a CronJob)."""
    body: dict[str, Any] = {
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "spec": {"template": {"spec": {}}},
    }
    for modify in modifiers:
        modify(body)
    return body


def of_lock(lock: str) -> Modifier:
    """Labelled with its lock, as the injection labels a guarded CronJob's Jobs."""
    return labelled({"cronlock.io/lock": lock})


def created_at(stamp: str) -> Modifier:
    return with_metadata(creationTimestamp=stamp)


def owned_by(cronjob: str, uid: str) -> Modifier:
    """Made by the CronJob `cronjob` (uid `uid`)."""
    return with_metadata(
        ownerReferences=[{"apiVersion": "batch/v1", "kind": "CronJob", "name": cronjob, "uid": uid}]
    )


def gated() -> Modifier:
    """Made from an injected CronJob: its pods pass cronlock's gate first."""

    def modify(body: dict[str, Any]) -> None:
        body["spec"]["template"]["spec"]["initContainers"] = [{"name": "cronlock-gate"}]

    return modify


def skipped(namespace: str) -> Modifier:
    """Failed as a skip does: its gate exited 75 and the pod failure policy failed the Job
    (the pod `<job>-x` in `namespace`)."""

    def modify(body: dict[str, Any]) -> None:
        pod_name = f"{namespace}/{body['metadata']['name']}-x"
        condition = {
            "type": "Failed",
            "status": "True",
            "reason": "PodFailurePolicy",
            "message": f"Container cronlock-gate for pod {pod_name} failed with exit code 75 "
            "matching FailJob rule at index 0",
        }
        body["status"] = {"conditions": [condition]}

    return modify


def failed() -> Modifier:
    """Failed after its retries."""
    return with_status(
        {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}
    )


def succeeded() -> Modifier:
    return with_status({"conditions": [{"type": "Complete", "status": "True"}]})


def pod(name: str, service_account: str, *modifiers: Modifier) -> dict[str, Any]:
    """A bare pod `name` on `service_account` that never starts (its image is never pulled,
    it runs as UID 65532): a holder identity to bind a token to; then each modifier
    (`in_namespace`, `with_uid`, `controlled_by`)."""
    body: dict[str, Any] = {
        "metadata": {"name": name},
        "spec": {
            "serviceAccountName": service_account,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
            "containers": [{"name": "main", "image": "busybox:never-pulled"}],
        },
    }
    for modify in modifiers:
        modify(body)
    return body


def controlled_by(kind: str, name: str, uid: str) -> Modifier:
    """Its controller: the Job of a run's pod, the CronJob of a Job."""
    group = "batch/v1" if kind in ("Job", "CronJob") else "v1"
    reference = {"apiVersion": group, "kind": kind, "name": name, "uid": uid, "controller": True}
    return with_metadata(ownerReferences=[reference])


# What most integration tests create through the API: no namespace in the body (the call
# names it), never due of itself, pods that are not restarted: a test makes its Jobs.
BY_HAND: tuple[Modifier, ...] = (in_namespace(None), never_due(), restart_policy("Never"))
