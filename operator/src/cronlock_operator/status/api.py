"""The API edge of `cronlock status`: a client like kubectl's, and the two lists it reads."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import kubernetes
import urllib3
import yaml

from cronlock_operator.status.model import annotations_of, metadata_of
from cronlock_sidecar import contract

DEFAULT_REQUEST_TIMEOUT: Final = 30.0
CONNECT_TIMEOUT: Final = 5.0
_SERVICE_ACCOUNT_NAMESPACE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


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
    """An ApiClient from KUBECONFIG (like kubectl) or, failing that, the pod's ServiceAccount."""
    configuration = kubernetes.client.Configuration()
    if kubeconfig is not None and not Path(kubeconfig).expanduser().is_file():
        raise UsageError(f"--kubeconfig {kubeconfig}: no such file")
    try:
        kubernetes.config.load_kube_config(
            config_file=kubeconfig,
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
        contexts, active = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig)
        chosen = next((entry for entry in contexts if entry["name"] == context), active)
        namespace = (chosen.get("context") or {}).get("namespace") or "default"
    except (
        kubernetes.config.ConfigException,
        yaml.YAMLError,
        ValueError,
        TypeError,
        KeyError,
        AttributeError,
        OSError,
    ) as error:
        # A kubeconfig that is there but not one (bad YAML, a list where a map belongs):
        # the user's to fix, so a usage error naming it, not a traceback.
        if not isinstance(error, kubernetes.config.ConfigException):
            where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
            raise UsageError(f"kubeconfig {where} cannot be read: {error}") from error
        if kubeconfig is not None or context is not None or os.environ.get("KUBECONFIG"):
            raise UsageError(f"kubeconfig: {error}") from error
        if not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise Unavailable(
                f"no Kubernetes configuration: {error} (set KUBECONFIG or --kubeconfig)"
            ) from error
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        except kubernetes.config.ConfigException as in_cluster_error:
            raise Unavailable(f"in-cluster configuration: {in_cluster_error}") from error
        namespace = _in_cluster_namespace()
    return Cluster(
        kubernetes.client.ApiClient(configuration), namespace, configuration.host, request_timeout
    )


def _in_cluster_namespace() -> str:
    try:
        return _SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


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
