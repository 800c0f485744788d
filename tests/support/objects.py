"""Reading and nudging objects on a real API server the way the integration tests do."""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

import kubernetes

from tests.support.controlplane import ControlPlane
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


class Versions:
    """Every version of a namespace's CronJobs the API server stores after `version` (a
    watch, re-opened where the last one ended until `stop`): the writes, one by one."""

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str, version: str) -> None:
        self.seen: list[dict[str, Any]] = []
        self._watch = kubernetes.watch.Watch()
        self._stopping = threading.Event()
        self.error: BaseException | None = None
        batch_api = batch(api)

        def follow() -> None:
            after = version
            try:
                while not self._stopping.is_set():
                    for event in self._watch.stream(
                        batch_api.list_namespaced_cron_job,
                        namespace,
                        resource_version=after,
                        timeout_seconds=60,
                    ):
                        body = api.sanitize_for_serialization(event["object"])
                        after = body["metadata"]["resourceVersion"]
                        self.seen.append(body)
            except Exception as error:  # noqa: BLE001 - closing the stream mid-read ends so
                if not self._stopping.is_set():
                    self.error = error

        self._thread = threading.Thread(target=follow, daemon=True)
        self._thread.start()

    def stop(self) -> list[dict[str, Any]]:
        self._stopping.set()
        self._watch.stop()
        self._thread.join(timeout=70)
        assert self.error is None, self.error
        return self.seen


def cronjob_editor(
    api: kubernetes.client.ApiClient,
    namespace: str,
    service_account_kubeconfig: Any,
    controlplane: ControlPlane,
    own: str,
) -> kubernetes.client.BatchV1Api:
    """A token that may create CronJobs and change only the one named `own`."""
    rbac = kubernetes.client.RbacAuthorizationV1Api(api)
    rules = [
        {"apiGroups": ["batch"], "resources": ["cronjobs"], "verbs": ["create", "list", "get"]},
        {
            "apiGroups": ["batch"],
            "resources": ["cronjobs"],
            "resourceNames": [own],
            "verbs": ["update", "patch"],
        },
    ]
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "editor"}, "rules": rules})
    path: Path = service_account_kubeconfig(namespace, "mallory")
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "editor"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "editor"},
            "subjects": [{"kind": "ServiceAccount", "name": "mallory", "namespace": namespace}],
        },
    )
    return kubernetes.client.BatchV1Api(controlplane.api_client(path))
