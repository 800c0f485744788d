"""What the API server does to CronJobs and the Jobs made from them (tests.support.gen builds
them), and the operator settings tests inject with."""

from __future__ import annotations

import copy
import json
from typing import Any

from kubernetes.client import ApiClient

from cronlock_operator.settings import OperatorSettings
from tests.support import gen

SETTINGS = OperatorSettings(sidecar_image="ghcr.io/example/cronlock:1.0.0")
NEW_SETTINGS = OperatorSettings(
    sidecar_image="ghcr.io/example/cronlock:1.1.0", sidecar_image_pull_policy="Always"
)


def changed(body: dict[str, Any]) -> dict[str, Any]:
    """`body` after an edit, with the new resourceVersion the API server would give it."""
    body["metadata"]["resourceVersion"] = gen.next_version()
    return body


def pod_spec(cronjob: dict[str, Any]) -> dict[str, Any]:
    """spec.jobTemplate.spec.template.spec of a CronJob."""
    spec: dict[str, Any] = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return spec


def server_defaults(cronjob: dict[str, Any]) -> dict[str, Any]:
    """The CronJob as the API server stores it (`gen.as_stored`), a copy."""
    stored = copy.deepcopy(cronjob)
    gen.as_stored()(stored)
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
