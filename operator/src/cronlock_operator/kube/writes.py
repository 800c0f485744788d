"""The operator's writes to the API server, each one idempotent and retried on hiccups."""

from __future__ import annotations

import contextlib
import datetime
import logging
import secrets
import socket
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import kubernetes

from cronlock_operator.cronjob.invalid import cut
from cronlock_operator.kube.answers import answered, done, found, raw
from cronlock_operator.kube.cache import ObjectCache
from cronlock_operator.kube.client import FIELD_MANAGER
from cronlock_operator.kube.errors import (
    APIError,
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    Rejected,
    Retry,
    final,
)
from cronlock_operator.kube.rbac_writes import HolderRbac
from cronlock_sidecar import contract

logger = logging.getLogger(__name__)

REPORTING_COMPONENT = "cronlock-operator"
JSON_PATCH = "application/json-patch+json"
# The operator's one write to a Job's spec: a queued Job let go, only if still suspended.
RESUME_PATCH = [
    {"op": "test", "path": "/spec/suspend", "value": True},
    {"op": "replace", "path": "/spec/suspend", "value": False},
]
MERGE_PATCH = "application/merge-patch+json"
# CronJobs per page of a start-up list (ours and kopf's): one page is what is parsed at once.
LIST_PAGE = 500


class Kube:
    """Typed clients over one ApiClient: one method per read or write, each safe to call
    again, its failures the tree of `kube/errors.py` (through `answers.answered`). What to
    write is decided by the pure layers; the holder Roles and RoleBindings go through
    `holder_rbac`."""

    def __init__(self, api: kubernetes.client.ApiClient) -> None:
        self.api = api
        self.batch = kubernetes.client.BatchV1Api(api)
        self.core = kubernetes.client.CoreV1Api(api)
        self.leases = kubernetes.client.CoordinationV1Api(api)
        self.rbac = kubernetes.client.RbacAuthorizationV1Api(api)
        self.holder_rbac = HolderRbac(self.rbac)
        self.instance = socket.gethostname()

    # --- CronJobs ------------------------------------------------------------------
    def patch_cronjob(
        self, namespace: str, name: str, patch: list[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """Apply a JSON patch; the CronJob as patched, or None when it is gone.

        A 422 with causes is the API server refusing the result, and a 403 from an
        admission policy (kube-system, or a sidecar image the chart's policy does not
        admit) is one too: Rejected, permanent. A bare 422 is the patch's resourceVersion
        test failing (a lost race, retried).
        """
        try:
            with answered(f"patch cronjob {namespace}/{name}"):
                return raw(
                    self.batch.patch_namespaced_cron_job(
                        name,
                        namespace,
                        patch,
                        _content_type=JSON_PATCH,
                        field_manager=FIELD_MANAGER,
                        _preload_content=False,
                    )
                )
        except NotFound:
            return None
        except (Invalid, Forbidden) as error:
            refusal = final(error)
            if refusal:
                raise Rejected(refusal) from error
            raise

    def annotate_cronjob(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> None:
        """Set (or, with None, remove) annotations; nothing when the CronJob is gone."""
        self._patch(
            self.batch.patch_namespaced_cron_job,
            "annotate cronjob",
            namespace,
            name,
            {"metadata": {"annotations": dict(annotations)}},
            MERGE_PATCH,
        )

    def list_cronjobs(self, namespaces: Sequence[str], into: ObjectCache) -> None:
        """Every CronJob in the watched namespaces (all when empty), into the cache page
        by page (a whole parsed list of 10,000 CronJobs would be the operator's peak).
        A 403 in a watched namespace is a Forbidden saying what is most likely missing."""
        scopes: list[str | None] = [*namespaces] or [None]
        for namespace in scopes:
            try:
                for item in self._list(
                    f"list cronjobs in namespace {namespace}" if namespace else "list cronjobs",
                    self.batch.list_cron_job_for_all_namespaces,
                    self.batch.list_namespaced_cron_job,
                    [namespace] if namespace else [],
                ):
                    into.put(item)
            except Forbidden as error:
                if namespace is None:
                    raise
                raise error.retold(f"{error}: {not_granted_in(namespace)}") from error.__cause__

    def list_leases(self, namespaces: Sequence[str]) -> Iterator[dict[str, Any]]:
        """Every Lease labelled as cronlock's in the watched namespaces (all when empty)."""
        return self._list(
            "list leases",
            self.leases.list_lease_for_all_namespaces,
            self.leases.list_namespaced_lease,
            namespaces,
            label_selector=f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}",
        )

    def _list(
        self,
        what: str,
        list_all: Any,
        list_in: Any,
        namespaces: Sequence[str],
        **params: Any,
    ) -> Iterator[dict[str, Any]]:
        """The items of a list, LIST_PAGE at a time, namespace by namespace."""
        scopes: Sequence[str | None] = list(namespaces) or [None]
        for namespace in scopes:
            token = None
            while True:
                with answered(what):
                    page_params = {
                        **params,
                        "limit": LIST_PAGE,
                        "_continue": token,
                        "_preload_content": False,
                    }
                    if namespace is None:
                        response = list_all(**page_params)
                    else:
                        response = list_in(namespace, **page_params)
                page = raw(response)
                yield from page.get("items") or []
                token = (page.get("metadata") or {}).get("continue")
                if not token:
                    break

    def labelled_namespaces(self) -> list[str]:
        """The namespaces labelled cronlock.io/enabled=true (the API server filters);
        a 403 is a Forbidden that names the grant or flag it needs."""
        try:
            return [
                item["metadata"]["name"]
                for item in self._list(
                    "list namespaces",
                    self.core.list_namespace,
                    None,
                    [],
                    label_selector=contract.NAMESPACE_SELECTOR,
                )
            ]
        except Forbidden as error:
            raise error.retold(
                "list namespaces: HTTP 403: namespace opt-in needs get, list and watch on "
                "namespaces (the chart's namespaceOptIn grants them); or run the operator "
                "with --no-namespace-opt-in"
            ) from error.__cause__

    def read_cronjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return found(
            f"get cronjob {namespace}/{name}",
            lambda: self.batch.read_namespaced_cron_job(name, namespace, _preload_content=False),
        )

    def read_deployment(self, namespace: str, name: str) -> dict[str, Any]:
        """One Deployment, as the API server has it (NotFound on 404; on 403 and hiccups
        a Retry): the operator's own, whose init containers name the images it injects."""
        with answered(f"get deployment {namespace}/{name}"):
            return raw(
                kubernetes.client.AppsV1Api(self.api).read_namespaced_deployment(
                    name, namespace, _preload_content=False
                )
            )

    # --- Leases --------------------------------------------------------------------
    def create_lease(self, namespace: str, body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """Create a Lease; on 409 read the one that exists. Returns the Lease as the API
        server has it and whether this call created it (Retry when it vanished between)."""
        name = body["metadata"]["name"]
        with contextlib.suppress(Conflict), answered(f"create lease {namespace}/{name}"):
            response = self.leases.create_namespaced_lease(
                namespace, body, field_manager=FIELD_MANAGER, _preload_content=False
            )
            logger.info("lease %s/%s created", namespace, name)
            return raw(response), True
        current = self.read_lease(namespace, name)
        if current is None:
            raise Retry(f"lease {namespace}/{name} vanished while being created")
        return current, False

    def merge_lease(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A strategic merge patch of a Lease's metadata; Retry when the Lease is gone."""
        try:
            with answered(f"patch lease {namespace}/{name}"):
                response = self.leases.patch_namespaced_lease(
                    name,
                    namespace,
                    patch,
                    _content_type="application/strategic-merge-patch+json",
                    field_manager=FIELD_MANAGER,
                    _preload_content=False,
                )
                return raw(response)
        except NotFound as error:
            # The cache was behind: the garbage collector deleted the Lease with its last
            # owner. A bare NotFound would read as "this CronJob is gone" and drop it.
            raise Retry(f"lease {namespace}/{name} vanished; creating it again") from error

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One pod, as the API server has it (None: gone): whose run holds a Lease."""
        return found(
            f"get pod {namespace}/{name}",
            lambda: self.core.read_namespaced_pod(name, namespace, _preload_content=False),
        )

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One Job, as the API server has it (None: gone)."""
        return found(
            f"get job {namespace}/{name}",
            lambda: self.batch.read_namespaced_job(name, namespace, _preload_content=False),
        )

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return found(
            f"get lease {namespace}/{name}",
            lambda: self.leases.read_namespaced_lease(name, namespace, _preload_content=False),
        )

    def patch_lease(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> bool:
        """A JSON patch (its first op tests resourceVersion); False if the Lease moved on."""
        return self._patch(
            self.leases.patch_namespaced_lease,
            "update lease",
            namespace,
            name,
            patch,
            JSON_PATCH,
            refused=(NotFound, Conflict, Invalid),
        )

    def delete_lease(self, namespace: str, name: str, version: str) -> None:
        """Delete a Lease on the condition it is still at `version` (gone already is fine)."""
        try:
            with answered(f"delete lease {namespace}/{name}"):
                done(
                    self.leases.delete_namespaced_lease(
                        name,
                        namespace,
                        body={"preconditions": {"resourceVersion": version}},
                        _preload_content=False,
                    )
                )
        except NotFound:
            return
        logger.info("lease %s/%s deleted: no CronJob uses it any more", namespace, name)

    # --- Jobs ----------------------------------------------------------------------
    def mark_job(
        self, namespace: str, name: str, annotation: str, value: str, *, outcome: str | None = None
    ) -> bool:
        """Annotate a Job once, and label its `outcome` if given; False when it is gone."""
        metadata: dict[str, Any] = {"annotations": {annotation: value}}
        if outcome is not None:
            metadata["labels"] = {contract.LABEL_OUTCOME: outcome}
        return self._patch(
            self.batch.patch_namespaced_job,
            "annotate job",
            namespace,
            name,
            {"metadata": metadata},
            MERGE_PATCH,
        )

    def _patch(
        self,
        call: Any,
        what: str,
        namespace: str,
        name: str,
        body: Any,
        content_type: str,
        refused: tuple[type[APIError], ...] = (NotFound,),
    ) -> bool:
        """One patch; False when the API answers one of `refused` (gone, moved on)."""
        try:
            with answered(f"{what} {namespace}/{name}"):
                done(
                    call(
                        name,
                        namespace,
                        body,
                        _content_type=content_type,
                        field_manager=FIELD_MANAGER,
                        _preload_content=False,
                    )
                )
        except refused:
            return False
        return True

    def resume_job(self, namespace: str, name: str) -> bool:
        """Let a queued Job go (`spec.suspend` true → false, policy: queue); False when it
        is gone or no longer suspended (the patch tests it first)."""
        return self._patch(
            self.batch.patch_namespaced_job,
            "resume job",
            namespace,
            name,
            RESUME_PATCH,
            JSON_PATCH,
            refused=(NotFound, Conflict, Invalid),
        )

    def delete_job(self, namespace: str, name: str, version: str | None = None) -> bool:
        """Delete a Job (and its pods); with `version`, only while it is that version.
        False when it is gone or (with `version`) changed."""
        options = (
            None
            if version is None
            else kubernetes.client.V1DeleteOptions(
                preconditions=kubernetes.client.V1Preconditions(resource_version=version),
                # In the body too: with a body the API server reads its options from it, and
                # a Job's default there is orphan (a finalizer, the Job seen again).
                propagation_policy="Background",
            )
        )
        try:
            with answered(f"delete job {namespace}/{name}"):
                done(
                    self.batch.delete_namespaced_job(
                        name,
                        namespace,
                        propagation_policy="Background",
                        body=options,
                        _preload_content=False,
                    )
                )
        except (NotFound, Conflict):
            return False
        return True

    # --- Events --------------------------------------------------------------------
    def post_event(
        self,
        involved: Mapping[str, Any],
        reason: str,
        message: str,
        warning: bool = False,
    ) -> None:
        """A core/v1 Event on the object (what `kubectl describe` and `get events` show)."""
        metadata = involved["metadata"]
        # Any CronJob author writes what an Event quotes: the Event and the log line carry
        # the same cut text, never a 200 KiB annotation.
        message = cut(message)
        now = datetime.datetime.now(datetime.UTC)
        event = {
            "metadata": {
                "name": f"{metadata['name']}.{secrets.token_hex(8)}",
                "namespace": metadata["namespace"],
            },
            "involvedObject": {
                "apiVersion": involved.get("apiVersion", "batch/v1"),
                "kind": involved.get("kind", "CronJob"),
                "name": metadata["name"],
                "namespace": metadata["namespace"],
                "uid": metadata.get("uid"),
            },
            "reason": reason,
            "message": message,
            "type": "Warning" if warning else "Normal",
            "source": {"component": REPORTING_COMPONENT},
            "reportingComponent": "cronlock.io/operator",
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        what = f"post event {reason} on {metadata['namespace']}/{metadata['name']}"
        try:
            with answered(what):
                done(
                    self.core.create_namespaced_event(
                        metadata["namespace"],
                        event,
                        field_manager=FIELD_MANAGER,
                        _preload_content=False,
                    )
                )
        except (NotFound, Forbidden) as error:
            if isinstance(error, Forbidden) and "being terminated" not in error.message:
                raise
            # Its namespace is gone or going: no retry (the poster would stall every other
            # namespace's Events behind it).
            logger.debug("%s: its namespace is being deleted", what)
            return
        level = logging.WARNING if warning else logging.INFO
        logger.log(level, "%s %s/%s: %s", reason, metadata["namespace"], metadata["name"], message)


def not_granted_in(namespace: str) -> str:
    """Why a watched namespace refuses the operator, and what to do: the chart grants it
    there by a RoleBinding made at install, which fails while the namespace does not
    exist. Helm's install refuses such a watchNamespaces entry by itself (lookup), but
    Argo CD and `helm template | kubectl apply` cannot ask the cluster (docs/FLEET.md)."""
    return (
        f"this operator has no RoleBinding in namespace {namespace}. If {namespace} did not "
        "exist when the release was installed or synced, its RoleBinding there could not be "
        f"made: create namespace {namespace} and sync (or helm upgrade) the release again, "
        "or remove it from watchNamespaces"
    )
