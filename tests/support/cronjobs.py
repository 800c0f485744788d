"""CronJobs as users write them, what the API server does to them, and the Jobs made from them."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

from kubernetes.client import ApiClient

from cronlock_operator.settings import OperatorSettings

SETTINGS = OperatorSettings(sidecar_image="ghcr.io/example/cronlock:1.0.0")
NEW_SETTINGS = OperatorSettings(
    sidecar_image="ghcr.io/example/cronlock:1.1.0", sidecar_image_pull_policy="Always"
)


def make_cronjob(
    *,
    name: str = "report",
    namespace: str | None = "team-a",
    schedule: str = "*/5 * * * *",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    restart_policy: str = "OnFailure",
    containers: list[dict[str, Any]] | None = None,
    job: dict[str, Any] | None = None,
    job_labels: dict[str, str] | None = None,
    cronjob_spec: dict[str, Any] | None = None,
    **pod_spec: Any,
) -> dict[str, Any]:
    """A CronJob as a user would write it (enabled unless annotations say otherwise).

    `namespace=None` leaves the namespace out, for a CronJob created through the API.
    `job` adds fields to the Job's spec (`backoffLimit`, `podFailurePolicy`), `job_labels`
    labels the Job template, `cronjob_spec` adds fields to the CronJob's own spec
    (`suspend`, `concurrencyPolicy`), and any other keyword goes into the pod's spec.
    """
    if annotations is None:
        annotations = {"cronlock.io/enabled": "true"}
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["annotations"] = annotations
    if labels is not None:
        metadata["labels"] = labels
    job_template: dict[str, Any] = {
        "spec": {
            **(job or {}),
            "template": {
                "spec": {
                    "restartPolicy": restart_policy,
                    "containers": containers
                    if containers is not None
                    else [{"name": "main", "image": "busybox:1.36", "command": ["true"]}],
                    **pod_spec,
                }
            },
        }
    }
    if job_labels is not None:
        job_template["metadata"] = {"labels": job_labels}
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": metadata,
        "spec": {"schedule": schedule, **(cronjob_spec or {}), "jobTemplate": job_template},
    }


_VERSIONS = itertools.count(1)


def changed(body: dict[str, Any]) -> dict[str, Any]:
    """`body` after an edit, with the new resourceVersion the API server would give it."""
    body["metadata"]["resourceVersion"] = str(next(_VERSIONS))
    return body


def pod_spec(cronjob: dict[str, Any]) -> dict[str, Any]:
    """spec.jobTemplate.spec.template.spec of a CronJob."""
    spec: dict[str, Any] = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return spec


def server_defaults(cronjob: dict[str, Any]) -> dict[str, Any]:
    """The CronJob as the API server stores it: defaults filled into every container and
    probe, and a resourceVersion of its own (the API server never gives two contents one)."""
    stored = copy.deepcopy(cronjob)
    stored["metadata"].setdefault("resourceVersion", str(next(_VERSIONS)))
    job_template = stored["spec"]["jobTemplate"]
    # ObjectMeta is a struct: Go's omitempty never leaves it out.
    job_template.setdefault("metadata", {})
    job_template["spec"]["template"].setdefault("metadata", {})
    spec = pod_spec(stored)
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
    return stored


def apply_json_patch(document: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """A JSON patch (RFC 6902: test, add, replace, remove on objects) applied to a copy."""
    result = copy.deepcopy(document)
    for operation in patch:
        *parents, last = [
            part.replace("~1", "/").replace("~0", "~") for part in operation["path"].split("/")[1:]
        ]
        node = result
        for part in parents:
            node = node[part]
        if operation["op"] == "test":
            if node[last] != operation["value"]:
                raise ValueError(f"test failed at {operation['path']}")
        elif operation["op"] == "add":
            node[last] = copy.deepcopy(operation["value"])
        elif operation["op"] == "replace":
            if last not in node:
                raise ValueError(f"replace of a missing member {operation['path']}")
            node[last] = copy.deepcopy(operation["value"])
        elif operation["op"] == "remove":
            del node[last]
        else:
            raise ValueError(f"unexpected op {operation['op']}")
    return result


def as_kubernetes_models_see_it(cronjob: dict[str, Any]) -> Any:
    """The CronJob read into the Kubernetes client's V1CronJob and written out again.

    Keys the API does not define are dropped on the way, so a misspelt field shows.
    """
    client = ApiClient()
    model = client.deserialize(json.dumps(cronjob), "V1CronJob", "application/json")
    return client.sanitize_for_serialization(model)  # type: ignore[no-untyped-call]


def job_from_cronjob(cronjob: dict[str, Any], name: str) -> dict[str, Any]:
    """The Job `kubectl create job NAME --from=cronjob/...` makes: template labels, owner."""
    template = cronjob["spec"]["jobTemplate"]
    metadata = cronjob["metadata"]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": dict((template.get("metadata") or {}).get("labels") or {}),
            "annotations": {"cronjob.kubernetes.io/instantiate": "manual"},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "CronJob",
                    "name": metadata["name"],
                    "uid": metadata["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": template["spec"],
    }
