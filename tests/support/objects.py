"""Reading and nudging objects on a real API server the way the integration tests do."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes

from tests.support.kube import wait_for


def batch(api: kubernetes.client.ApiClient) -> kubernetes.client.BatchV1Api:
    return kubernetes.client.BatchV1Api(api)


def read(api: kubernetes.client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    raw = batch(api).read_namespaced_cron_job(name, namespace)
    result: dict[str, Any] = api.sanitize_for_serialization(raw)
    return result


def comparable(cronjob: dict[str, Any]) -> dict[str, Any]:
    """What the user wrote and the server stored, without the fields every write changes."""
    result = copy.deepcopy(cronjob)
    for key in ("resourceVersion", "generation", "managedFields"):
        result["metadata"].pop(key, None)
    result.pop("status", None)
    return result


def has_sidecar(cronjob: dict[str, Any]) -> bool:
    """The job template carries cronlock's sidecar (the CronJob is injected)."""
    spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return any(c["name"] == "cronlock" for c in spec.get("initContainers") or [])


def injected(api: kubernetes.client.ApiClient, namespace: str, name: str) -> bool:
    return has_sidecar(read(api, namespace, name))


def annotate(
    api: kubernetes.client.ApiClient, namespace: str, name: str, **values: str | None
) -> None:
    batch(api).patch_namespaced_cron_job(
        name,
        namespace,
        {
            "metadata": {
                "annotations": {f"cronlock.io/{k.replace('_', '-')}": v for k, v in values.items()}
            }
        },
        _content_type="application/merge-patch+json",
    )


def events(
    api: kubernetes.client.ApiClient, namespace: str, name: str
) -> list[tuple[str, str, str]]:
    items = (
        kubernetes.client.CoreV1Api(api)
        .list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
        .items
    )
    return [(event.type, event.reason, event.message) for event in items]


def wait_event(
    api: kubernetes.client.ApiClient, namespace: str, name: str, reason: str, count: int = 1
) -> list[str]:
    return wait_for(
        lambda: (
            found
            if len(found := [m for _, r, m in events(api, namespace, name) if r == reason]) >= count
            else None
        ),
        timeout=30,
        what=f"{count} {reason} Event(s) on {namespace}/{name}",
    )
