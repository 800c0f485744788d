"""The API edge of `cronlock status`: a client like kubectl's, and the two lists it reads."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn, Protocol
from urllib.parse import urlsplit

import kubernetes
import urllib3
import yaml

from cronlock_operator.cronjob.config import GUARDING, InvalidConfig, opt_in
from cronlock_operator.kube import client
from cronlock_operator.kube.answers import NO_ANSWER, api_error
from cronlock_operator.kube.errors import (
    APIError,
    Expired,
    Forbidden,
    KubeConfigError,
    error_of,
)
from cronlock_operator.objects import annotations_of, metadata_of
from cronlock_operator.status.model import Change, Kind
from cronlock_sidecar import contract

DEFAULT_REQUEST_TIMEOUT: Final = 30.0
CONNECT_TIMEOUT: Final = 5.0
# Every Lease cronlock writes carries this label (the operator's, the sidecar's, the leader's):
# the API server leaves out every other Lease in the namespace.
LEASE_SELECTOR: Final = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
# Items a list asks for at once (kubectl's chunk size); the rest follow with `continue`.
PAGE_SIZE: Final = 500
# The API server ends each watch after this long; it is started again from where it ended.
# Short, so that a server that stops answering is noticed within it plus --request-timeout.
WATCH_SECONDS: Final = 60
RETRY_SECONDS: Final = 2.0
# How the API server's refusals read to whoever ran the command.
_VERDICTS: Final = {401: "unauthorized", 403: "forbidden"}
_OVERRIDE_CONTEXT: Final = "cronlock-status --user/--cluster"


class UsageError(Exception):
    """A flag names something that does not exist (a kubeconfig file, a context, a user),
    or flags that do not go together."""


@dataclass(frozen=True)
class Overrides:
    """kubectl's flags that change who you are to the API server and which server it is."""

    impersonate: str | None = None  # --as: Impersonate-User
    impersonate_groups: tuple[str, ...] = ()  # --as-group: one Impersonate-Group each
    token: str | None = None  # --token: instead of the kubeconfig user's credentials
    server: str | None = None  # --server
    user: str | None = None  # --user: the kubeconfig's users entry
    cluster: str | None = None  # --cluster: the kubeconfig's clusters entry
    insecure_skip_tls_verify: bool = False

    def problem(self) -> str | None:
        """Why these flags cannot be used together or as given; None when they can."""
        if self.impersonate_groups and not self.impersonate:
            return (
                "--as-group needs --as: the API server impersonates groups only together "
                "with a user"
            )
        if self.server is not None:
            scheme = urlsplit(_server_url(self.server)).scheme
            if scheme not in ("http", "https") or not urlsplit(_server_url(self.server)).netloc:
                return f"--server {self.server!r}: not an http(s) URL of an API server"
        return None


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
    overrides: Overrides | None = None,
) -> Cluster:
    """An ApiClient as every cronlock command finds one (`kube.client.connect`: the
    kubeconfig asked for, else the pod's ServiceAccount, else `~/.kube/config`), then
    changed by kubectl's flags as kubectl changes it. UsageError for flags or a kubeconfig
    that cannot be used, `NoConfiguration` when there is nothing to connect with."""
    overrides = overrides or Overrides()
    problem = overrides.problem()
    if problem is not None:
        raise UsageError(problem)
    entries = overrides.user is not None or overrides.cluster is not None
    if entries and kubeconfig is None and not os.environ.get("KUBECONFIG"):
        # --user and --cluster name kubeconfig entries: in a pod too, a kubeconfig it is.
        kubeconfig = _default_kubeconfig(overrides)
    try:
        connection = client.connect(kubeconfig, context)
    except KubeConfigError as error:
        raise UsageError(str(error)) from error
    configuration = connection.api.configuration
    user_agent = connection.api.user_agent
    connection.api.close()
    if entries:
        configuration = _with_entries(kubeconfig, context, overrides)
    _override(configuration, overrides)
    api = kubernetes.client.ApiClient(configuration)
    api.user_agent = user_agent
    if overrides.impersonate:
        impersonation = [("Impersonate-User", overrides.impersonate)] + [
            ("Impersonate-Group", group) for group in overrides.impersonate_groups
        ]
        api.rest_client.pool_manager = _Impersonating(api.rest_client.pool_manager, impersonation)
    return Cluster(api, connection.namespace, configuration.host, request_timeout)


def _server_url(server: str) -> str:
    # kubectl takes host:port too, and speaks TLS to it.
    return server if "://" in server else f"https://{server}"


def _default_kubeconfig(overrides: Overrides) -> str:
    path = str(kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION)
    if not Path(path).expanduser().is_file():
        flag = "--user" if overrides.user is not None else "--cluster"
        raise UsageError(f"{flag} names a kubeconfig entry, and there is no kubeconfig ({path})")
    return str(Path(path).expanduser())


def _with_entries(kubeconfig: str | None, context: str | None, overrides: Overrides) -> Any:
    """A Configuration from the kubeconfig's context with its user and cluster entries
    replaced by --user and --cluster (the context's namespace stays)."""
    path = kubeconfig or os.environ.get("KUBECONFIG") or ""
    configuration = kubernetes.client.Configuration()
    try:
        merged = kubernetes.config.kube_config.KubeConfigMerger(path).config
        name = context or merged["current-context"]
        chosen = dict(merged["contexts"].get_with_name(name)["context"].value)
        for flag, entries, key, wanted in (
            ("--user", "users", "user", overrides.user),
            ("--cluster", "clusters", "cluster", overrides.cluster),
        ):
            if wanted is None:
                continue
            if merged.safe_get(entries) is None or (
                merged[entries].get_with_name(wanted, safe=True) is None
            ):
                raise UsageError(f"{flag} {wanted}: the kubeconfig has no {key} of that name")
            chosen[key] = wanted
        merged.value["contexts"].append({"name": _OVERRIDE_CONTEXT, "context": chosen})
        loader = kubernetes.config.kube_config.KubeConfigLoader(
            config_dict=merged, active_context=_OVERRIDE_CONTEXT, config_base_path=None
        )
        loader.load_and_set(configuration)
    except kubernetes.config.ConfigException as error:
        raise UsageError(f"kubeconfig: {error}") from error
    except (yaml.YAMLError, ValueError, TypeError, KeyError, AttributeError, OSError) as error:
        raise UsageError(f"kubeconfig {path} cannot be read: {error}") from error
    return configuration


def _override(configuration: Any, overrides: Overrides) -> None:
    if overrides.insecure_skip_tls_verify:
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    if overrides.token:
        # The token replaces whatever the kubeconfig user authenticates with.
        configuration.api_key = {"BearerToken": f"Bearer {overrides.token}"}
        configuration.api_key_prefix = {}
        configuration.refresh_api_key_hook = None
        configuration.cert_file = None
        configuration.key_file = None
        configuration.username = None
        configuration.password = None
    _set_cluster(configuration, overrides)
    refresh = configuration.refresh_api_key_hook
    if refresh is not None:
        # The kubeconfig loader's hook refreshes expiring credentials before each request,
        # and writes the kubeconfig's server and itself back while at it: the flags have the
        # last word, and this hook stays the one that runs.
        def refresh_then_override(settings: Any) -> None:
            refresh(settings)
            _set_cluster(settings, overrides)
            settings.refresh_api_key_hook = refresh_then_override

        configuration.refresh_api_key_hook = refresh_then_override


def _set_cluster(configuration: Any, overrides: Overrides) -> None:
    if overrides.server is not None:
        configuration.host = _server_url(overrides.server).rstrip("/")
    if overrides.insecure_skip_tls_verify:
        # As kubectl: the flag wins over the kubeconfig's certificate authority.
        configuration.verify_ssl = False
        configuration.ssl_ca_cert = None


class _Impersonating:
    """The client's connection pool, adding kubectl's impersonation headers to every request
    (one Impersonate-Group header per group, which a header dict cannot hold)."""

    def __init__(self, pool: Any, headers: list[tuple[str, str]]) -> None:
        self._pool = pool
        self._headers = headers

    def request(self, method: str, url: str, **kwargs: Any) -> Any:
        headers = urllib3.HTTPHeaderDict(kwargs.pop("headers", None) or {})
        for name, value in self._headers:
            headers.add(name, value)
        return self._pool.request(method, url, headers=headers, **kwargs)

    def clear(self) -> None:
        self._pool.clear()


@dataclass(frozen=True)
class Listing:
    items: list[dict[str, Any]]
    resource_version: str


class Source(Protocol):
    """One kind of object to follow: listed whole, then watched from the list's version."""

    kind: Kind

    def list(self) -> Listing: ...

    def watch(self, resource_version: str) -> Iterator[dict[str, Any]]: ...


class Collection:
    """The CronJobs (matching -l) or cronlock's Leases of a namespace, or of all of them."""

    def __init__(self, cluster: Cluster, kind: Kind, namespace: str | None, selector: str) -> None:
        self.kind: Kind = kind
        self._cluster = cluster
        self._namespace = namespace
        self._selector = selector

    @property
    def what(self) -> str:
        resource = "cronjobs.batch" if self.kind == "cronjobs" else "leases.coordination.k8s.io"
        where = (
            "in all namespaces" if self._namespace is None else f"in namespace {self._namespace}"
        )
        return f"{resource} {where}"

    def list(self) -> Listing:
        """Every item, a page of PAGE_SIZE at a time; from the start again if the pages'
        snapshot expired half-way (410), as kubectl's pager does."""
        tries = 3
        while True:
            try:
                return self._pages()
            except Expired as error:
                tries -= 1
                if not tries:
                    told = f"cannot list {self.what}: its pages kept expiring (410 Gone)"
                    raise error.retold(told) from error

    def _pages(self) -> Listing:
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            with _refusal(self._cluster, f"list {self.what}"):
                response = self._call(
                    label_selector=self._selector,
                    limit=PAGE_SIZE,
                    _continue=token,
                    _request_timeout=self._cluster.timeouts,
                )
                page = json.loads(response.data)
            items.extend(page.get("items") or [])
            metadata = page.get("metadata") or {}
            token = metadata.get("continue") or None
            if token is None:
                return Listing(items, str(metadata.get("resourceVersion") or ""))

    def watch(self, resource_version: str) -> Iterator[dict[str, Any]]:
        """The events after `resource_version`, until the server ends the watch; raises
        Expired when that version is too old, another APIError when the server fails or
        refuses. The request is made here, its events are read as they are iterated."""
        with _refusal(self._cluster, f"watch {self.what}"):
            response = self._call(
                label_selector=self._selector,
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=WATCH_SECONDS,
                _request_timeout=(
                    self._cluster.timeouts[0],
                    WATCH_SECONDS + self._cluster.request_timeout,
                ),
            )
        return self._events(response)

    def _events(self, response: Any) -> Iterator[dict[str, Any]]:
        try:
            with _refusal(self._cluster, f"watch {self.what}"):
                for line in kubernetes.watch.watch.iter_resp_lines(response):
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        # A Status in the stream: the same answer as one to a request.
                        status = event.get("object") or {}
                        message = str(status.get("message") or "")
                        raise error_of(
                            int(status.get("code") or 0),
                            f"cannot watch {self.what}: refused: "
                            f"{message or status.get('reason') or status}",
                            reason=str(status.get("reason") or ""),
                            message=message,
                        )
                    yield event
        finally:
            response.close()
            response.release_conn()

    def _call(self, **kwargs: Any) -> Any:
        api = self._cluster.api
        kwargs["_preload_content"] = False
        if self.kind == "cronjobs":
            batch = kubernetes.client.BatchV1Api(api)
            if self._namespace is None:
                return batch.list_cron_job_for_all_namespaces(**kwargs)
            return batch.list_namespaced_cron_job(self._namespace, **kwargs)
        coordination = kubernetes.client.CoordinationV1Api(api)
        if self._namespace is None:
            return coordination.list_lease_for_all_namespaces(**kwargs)
        return coordination.list_namespaced_lease(self._namespace, **kwargs)


def labelled_namespaces(cluster: Cluster, namespace: str | None) -> frozenset[str] | None:
    """The namespaces labelled cronlock.io/enabled=true (of `namespace` alone, when given);
    None when the credentials may not read namespaces (403): many who may read CronJobs
    may not."""
    selector = contract.NAMESPACE_SELECTOR
    if namespace is not None:
        selector += f",kubernetes.io/metadata.name={namespace}"
    core = kubernetes.client.CoreV1Api(cluster.api)
    try:
        with _refusal(cluster, "list namespaces"):
            answer = core.list_namespace(label_selector=selector, _preload_content=False)
            items = json.loads(answer.data).get("items") or []
    except Forbidden:
        return None
    return frozenset(str(metadata_of(item).get("name", "")) for item in items)


def fetch(
    cluster: Cluster, namespace: str | None, selector: str = ""
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], frozenset[str] | None]:
    """The guarded CronJobs in `namespace` (None: every namespace) matching the label
    `selector`: annotated enabled=true, or in a namespace labelled so and not annotated;
    cronlock's Leases there (none listed when no CronJob is guarded); and the labelled
    namespaces, read only when a CronJob without the annotation was listed (None when the
    credentials may not read namespaces)."""
    listed = Collection(cluster, "cronjobs", namespace, selector).list().items
    labelled: frozenset[str] | None = frozenset()
    if any(unannotated(item) for item in listed):
        labelled = labelled_namespaces(cluster, namespace)
    cronjobs = [item for item in listed if _guarded(item, labelled or frozenset())]
    if not cronjobs:
        return [], [], labelled
    leases = Collection(cluster, "leases", namespace, LEASE_SELECTOR).list().items
    return cronjobs, leases, labelled


def unannotated(cronjob: dict[str, Any]) -> bool:
    """Without cronlock.io/enabled: its namespace's label decides."""
    return contract.ANNOTATION_ENABLED not in annotations_of(cronjob)


def _guarded(cronjob: dict[str, Any], labelled: frozenset[str]) -> bool:
    """The operator's rule (config.opt_in); a bad cronlock.io/enabled value guards nothing."""
    try:
        return opt_in(cronjob, metadata_of(cronjob).get("namespace") in labelled) in GUARDING
    except InvalidConfig:
        return False


def follow(
    source: Source,
    report: Callable[[Change], None],
    pause: Callable[[float], None],
    retry_seconds: float = RETRY_SECONDS,
) -> NoReturn:
    """List, then watch from the list's resourceVersion, for as long as the process lives;
    report the list, each event and each failure. A watch that ends is started again from
    the last version seen; one whose version expired (410) lists again; after a failure
    (a list whose pages kept expiring too) it waits `retry_seconds` and carries on from
    where it was."""
    version: str | None = None
    while True:
        try:
            if version is None:
                listing = source.list()
                report(Change(source.kind, "LISTED", tuple(listing.items)))
                version = listing.resource_version
            events = source.watch(version)
            report(Change(source.kind, "WATCHING"))
            for event in events:
                kind = event.get("type")
                obj = event.get("object") or {}
                # Bookmarks carry only this: where to start the next watch from.
                version = str(metadata_of(obj).get("resourceVersion") or "") or version
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    report(Change(source.kind, kind, (obj,)))
        except Expired as error:
            if version is None:
                report(Change(source.kind, "FAILED", error=str(error)))
                pause(retry_seconds)
            version = None
        except APIError as error:
            report(Change(source.kind, "FAILED", error=str(error)))
            pause(retry_seconds)


@contextmanager
def _refusal(cluster: Cluster, what: str) -> Iterator[None]:
    """A request's failures as the tree's errors (`answers.api_error`), told as the
    command tells them: the request that failed, and why."""
    try:
        yield
    except (kubernetes.client.ApiException, *NO_ANSWER, ValueError) as error:
        # ValueError: a body that is not JSON (not an API server, or one cut off half-way).
        answer = api_error(what, error)
        if answer.status == 0:
            told = f"API server {cluster.server}: {error}"
            if not isinstance(error, ValueError):
                told = f"API server {cluster.server} unreachable: {answer.reason}"
        else:
            verdict = _VERDICTS.get(answer.status, "refused")
            told = f"{verdict}: {answer.message or f'HTTP {answer.status} {answer.reason}'}"
        raise answer.retold(f"cannot {what}: {told}") from error
