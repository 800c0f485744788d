"""The API edge of `cronlock status`: a client like kubectl's, and the two lists it reads."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

import kubernetes
import urllib3

from cronlock_operator.kube import client
from cronlock_operator.objects import annotations_of, metadata_of
from cronlock_sidecar import contract

DEFAULT_REQUEST_TIMEOUT: Final = 30.0
CONNECT_TIMEOUT: Final = 5.0


class Unavailable(Exception):
    """The API server could not be reached, or refused a request; the message says which."""


class UsageError(Exception):
    """A flag names something that does not exist (a kubeconfig file, a context)."""


@dataclass(frozen=True)
class Cluster:
    api: Any  # kubernetes.client.ApiClient
    namespace: str
    server: str
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT

    @property
    def timeouts(self) -> tuple[float, float]:
        """(connect, read) for each request, like kubectl's --request-timeout."""
        return min(CONNECT_TIMEOUT, self.request_timeout), self.request_timeout


def connect(
    kubeconfig: str | None,
    context: str | None,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
) -> Cluster:
    """An ApiClient as every cronlock command finds one (`kube.client.connect`: the
    kubeconfig asked for, else the pod's ServiceAccount, else `~/.kube/config`)."""
    try:
        connection = client.connect(kubeconfig, context)
    except client.KubeconfigError as error:
        raise UsageError(str(error)) from error
    except client.NoConfiguration as error:
        raise Unavailable(str(error)) from error
    return Cluster(connection.api, connection.namespace, connection.host, request_timeout)


def fetch(
    cluster: Cluster, namespace: str | None, selector: str = ""
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The guarded CronJobs in `namespace` (None: every namespace) matching the label
    `selector`, and their namespaces' Leases."""
    batch = kubernetes.client.BatchV1Api(cluster.api)
    coordination = kubernetes.client.CoordinationV1Api(cluster.api)
    where = "in all namespaces" if namespace is None else f"in namespace {namespace}"
    with _refusal(cluster, f"list cronjobs.batch {where}"):
        if namespace is None:
            listed = batch.list_cron_job_for_all_namespaces(
                label_selector=selector, _request_timeout=cluster.timeouts
            )
        else:
            listed = batch.list_namespaced_cron_job(
                namespace, label_selector=selector, _request_timeout=cluster.timeouts
            )
    cronjobs = [
        item
        for item in cluster.api.sanitize_for_serialization(listed).get("items") or []
        if annotations_of(item).get(contract.ANNOTATION_ENABLED) == "true"
    ]
    leases: list[dict[str, Any]] = []
    for lease_namespace in sorted({metadata_of(item).get("namespace", "") for item in cronjobs}):
        with _refusal(cluster, f"list leases.coordination.k8s.io in namespace {lease_namespace}"):
            listed = coordination.list_namespaced_lease(
                lease_namespace, _request_timeout=cluster.timeouts
            )
        leases.extend(cluster.api.sanitize_for_serialization(listed).get("items") or [])
    return cronjobs, leases


@contextmanager
def _refusal(cluster: Cluster, what: str) -> Iterator[None]:
    """Turn API errors into Unavailable naming the request that failed."""
    try:
        yield
    except kubernetes.client.ApiException as error:
        reason = _server_message(error) or f"HTTP {error.status} {error.reason}"
        verdict = {401: "unauthorized", 403: "forbidden"}.get(error.status, "refused")
        raise Unavailable(f"cannot {what}: {verdict}: {reason}") from error
    except urllib3.exceptions.MaxRetryError as error:
        raise Unavailable(
            f"cannot {what}: API server {cluster.server} unreachable: {error.reason or error}"
        ) from error
    except (urllib3.exceptions.HTTPError, OSError) as error:
        raise Unavailable(
            f"cannot {what}: API server {cluster.server} unreachable: {error}"
        ) from error


def _server_message(error: Any) -> str:
    try:
        body = json.loads(error.body or "")
    except (TypeError, ValueError):
        return ""
    return str(body.get("message", "")) if isinstance(body, dict) else ""
