"""The operator's writes to the API server, each one idempotent and retried on hiccups."""

from __future__ import annotations

import datetime
import json
import logging
import secrets
import socket
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import kubernetes
import urllib3

from cronlock_operator.cache import ObjectCache
from cronlock_operator.config import LockConfig
from cronlock_operator.workqueue import Retry
from cronlock_sidecar import contract
from cronlock_sidecar.lockmodel import read_lease

logger = logging.getLogger(__name__)

REPORTING_COMPONENT = "cronlock-operator"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
_RETRIABLE = {409, 422, 429, 500, 502, 503, 504}


@contextmanager
def transient_errors(what: str) -> Iterator[None]:
    """Turn API hiccups into Retry so the work queue backs off and tries again."""
    try:
        yield
    except kubernetes.client.ApiException as error:
        if error.status in _RETRIABLE or error.status == 403:
            # 403 too: the RBAC that is missing now may be granted in a moment.
            raise Retry(f"{what}: HTTP {error.status} {error.reason}") from error
        raise
    except (urllib3.exceptions.HTTPError, OSError) as error:
        raise Retry(f"{what}: {error}") from error


class Rejected(Exception):
    """The API server refused what cronlock wrote as invalid: retrying cannot help."""


def _invalid_message(error: Any) -> str:
    """The API server's message for a 422 that names what is invalid; "" for a bare one."""
    try:
        status = json.loads(error.body or "")
    except (TypeError, ValueError):
        return ""
    if not isinstance(status, dict) or not (status.get("details") or {}).get("causes"):
        return ""
    return str(status.get("message") or "")


class NotOurs(Exception):
    """An object cronlock would write exists, and cronlock did not make it: it is left alone.

    The message names the object and what to do; the CronJob that needed it gets it as a
    Warning Event and stays as it was. `names` maps each such object's name to its message.
    """

    def __init__(self, message: str, names: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.names = dict(names or {})


def _made_by_cronlock(obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(contract.LABEL_MANAGED_BY) == contract.MANAGED_BY)


def _lease_is_ours(lease: Mapping[str, Any], owner_uid: str, lock: str) -> bool:
    """Labelled as cronlock's Lease for `lock` and owned by this CronJob (among others)."""
    record = read_lease(lease)
    return record.managed and record.lock == lock and owner_uid in record.owner_uids


def raw(response: Any) -> dict[str, Any]:
    """The object exactly as the API server sent it (the client's models reformat times)."""
    data = response.data
    response.release_conn()
    result: dict[str, Any] = json.loads(data)
    return result


def done(response: Any) -> None:
    """Finish a response whose body nobody needs, so its connection goes back to the pool.

    With `_preload_content=False` the client leaves the body unread, and urllib3 keeps an
    unread connection out of the pool: every write then opened a new TLS connection
    (handshakes were a third of the operator's CPU while injecting 1,000 CronJobs).
    """
    response.drain_conn()
    response.release_conn()


def _refuse_foreign_lease(lease: Mapping[str, Any], lock: str) -> None:
    """A Lease of that name that cronlock did not make (or made for another lock)."""
    record = read_lease(lease)
    if record.managed and record.lock in (None, lock):
        return  # ours (labelled before the lock label existed, or for this very lock)
    why = (
        f"lacks the label {contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
        if not record.managed
        else f"is labelled for lock {record.lock}"
    )
    raise NotOurs(
        f"lease {record.namespace}/{record.name} exists and {why}; cronlock does not adopt "
        f"it, and leaves the CronJob as it was: set {contract.ANNOTATION_LOCK} to another "
        "lock name, or delete that Lease if nothing else uses it"
    )


def owner_reference(cronjob: Mapping[str, Any]) -> dict[str, Any]:
    metadata = cronjob["metadata"]
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "name": metadata["name"],
        "uid": metadata["uid"],
    }


class Kube:
    """Typed clients over one ApiClient; every method is safe to call again."""

    def __init__(self, api: kubernetes.client.ApiClient) -> None:
        self.api = api
        self.batch = kubernetes.client.BatchV1Api(api)
        self.core = kubernetes.client.CoreV1Api(api)
        self.leases = kubernetes.client.CoordinationV1Api(api)
        self.rbac = kubernetes.client.RbacAuthorizationV1Api(api)
        self.instance = socket.gethostname()

    # --- CronJobs ------------------------------------------------------------------
    def patch_cronjob(
        self, namespace: str, name: str, patch: list[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """Apply a JSON patch; the CronJob as patched, or None when it is gone.

        A 422 with causes is the API server refusing the result (Rejected, permanent); a
        bare 422 is the patch's resourceVersion test failing (a lost race, retried).
        """
        with transient_errors(f"patch cronjob {namespace}/{name}"):
            try:
                return raw(
                    self.batch.patch_namespaced_cron_job(
                        name, namespace, patch, _content_type=JSON_PATCH, _preload_content=False
                    )
                )
            except kubernetes.client.ApiException as error:
                if error.status == 404:
                    return None
                message = _invalid_message(error) if error.status == 422 else ""
                if message:
                    raise Rejected(message) from error
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
        by page (a whole parsed list of 10,000 CronJobs would be the operator's peak)."""
        scopes: Sequence[str | None] = list(namespaces) or [None]
        for namespace in scopes:
            token = None
            while True:
                with transient_errors("list cronjobs"):
                    if namespace is None:
                        response = self.batch.list_cron_job_for_all_namespaces(
                            limit=500, _continue=token, _preload_content=False
                        )
                    else:
                        response = self.batch.list_namespaced_cron_job(
                            namespace, limit=500, _continue=token, _preload_content=False
                        )
                page = raw(response)
                for item in page.get("items") or []:
                    into.put(item)
                token = (page.get("metadata") or {}).get("continue")
                if not token:
                    break

    def read_cronjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        with transient_errors(f"get cronjob {namespace}/{name}"):
            try:
                return raw(
                    self.batch.read_namespaced_cron_job(name, namespace, _preload_content=False)
                )
            except kubernetes.client.ApiException as error:
                if error.status == 404:
                    return None
                raise

    # --- Leases --------------------------------------------------------------------
    def ensure_lease(
        self,
        namespace: str,
        name: str,
        cronjob: Mapping[str, Any],
        config: LockConfig,
        cached: Mapping[str, Any] | None,
    ) -> dict[str, Any] | None:
        """The Lease exists, labelled as ours (and with its lock), owned by this CronJob.

        `cached` is the Lease as the operator's watch last saw it: when it already is as
        it should be, nothing is sent; when the watch has not seen it, creating is tried
        first, since that is what a new lock needs. Returns the Lease as the API server
        answered (None when nothing was sent), for the cache until the watch catches up.
        """
        reference = owner_reference(cronjob)
        labels = {contract.LABEL_MANAGED_BY: contract.MANAGED_BY, contract.LABEL_LOCK: config.lock}
        if cached is not None and _lease_is_ours(cached, reference["uid"], config.lock):
            return None
        with transient_errors(f"ensure lease {namespace}/{name}"):
            if cached is None:
                try:
                    response = self.leases.create_namespaced_lease(
                        namespace,
                        {
                            "metadata": {
                                "name": name,
                                "labels": labels,
                                "ownerReferences": [reference],
                            },
                            "spec": {"leaseDurationSeconds": config.timing.lease_duration_seconds},
                        },
                        _preload_content=False,
                    )
                    logger.info("lease %s/%s created", namespace, name)
                    return raw(response)
                except kubernetes.client.ApiException as error:
                    if error.status != 409:
                        raise
                current = self.read_lease(namespace, name)
                if current is None:
                    raise Retry(f"lease {namespace}/{name} vanished while being created")
                if _lease_is_ours(current, reference["uid"], config.lock):
                    return current
                _refuse_foreign_lease(current, config.lock)
            else:
                _refuse_foreign_lease(cached, config.lock)
            # Strategic merge: ownerReferences merge by uid, so other owners stay.
            try:
                response = self.leases.patch_namespaced_lease(
                    name,
                    namespace,
                    {
                        "metadata": {
                            "labels": labels,
                            "ownerReferences": [reference],
                        }
                    },
                    _content_type="application/strategic-merge-patch+json",
                    _preload_content=False,
                )
                return raw(response)
            except kubernetes.client.ApiException as error:
                if error.status != 404:
                    raise
                # The cache was behind: the garbage collector deleted the Lease with its
                # last owner. A bare 404 would read as "this CronJob is gone" and drop it.
                raise Retry(f"lease {namespace}/{name} vanished; creating it again") from error

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        with transient_errors(f"get lease {namespace}/{name}"):
            try:
                return raw(
                    self.leases.read_namespaced_lease(name, namespace, _preload_content=False)
                )
            except kubernetes.client.ApiException as error:
                if error.status == 404:
                    return None
                raise

    def patch_lease(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> bool:
        """A JSON patch (its first op tests resourceVersion); False if the Lease moved on."""
        return self._patch(
            self.leases.patch_namespaced_lease,
            "update lease",
            namespace,
            name,
            patch,
            JSON_PATCH,
            refused=(404, 409, 422),
        )

    def drop_lease_owner(self, namespace: str, name: str, uid: str) -> None:
        """Forget a CronJob that no longer uses this Lease; delete it once nobody does."""
        lease = self.read_lease(namespace, name)
        if lease is None:
            return
        if not _made_by_cronlock(lease):
            return  # not ours to edit, nor to delete
        metadata = lease["metadata"]
        owners = metadata.get("ownerReferences") or []
        keep = [owner for owner in owners if owner.get("uid") != uid]
        if len(keep) == len(owners):
            return
        version = metadata["resourceVersion"]
        if keep:
            moved = not self.patch_lease(
                namespace,
                name,
                [
                    {"op": "test", "path": "/metadata/resourceVersion", "value": version},
                    {"op": "replace", "path": "/metadata/ownerReferences", "value": keep},
                ],
            )
        else:
            with transient_errors(f"delete lease {namespace}/{name}"):
                done(
                    self.leases.delete_namespaced_lease(
                        name,
                        namespace,
                        body={"preconditions": {"resourceVersion": version}},
                        _preload_content=False,
                    )
                )
            logger.info("lease %s/%s deleted: no CronJob uses it any more", namespace, name)
            moved = False
        if moved:
            raise Retry(f"lease {namespace}/{name} changed while dropping an owner")

    # --- RBAC ----------------------------------------------------------------------
    def write_holder_rbac(
        self,
        namespace: str,
        roles: Sequence[dict[str, Any]],
        bindings: Sequence[dict[str, Any]],
    ) -> None:
        """Exactly these holder Roles and RoleBindings: each written if it differs, and the
        labelled ones no guarded CronJob needs any more deleted.

        A Role or RoleBinding of the same name that cronlock did not make is left alone;
        the others are written all the same, then NotOurs names the ones left alone.
        """
        conflicts: dict[str, str] = {}
        with transient_errors(f"sync rbac in {namespace}"):
            for role, binding in zip(roles, bindings, strict=True):
                try:
                    self._upsert(
                        self.rbac.read_namespaced_role,
                        self.rbac.create_namespaced_role,
                        self.rbac.replace_namespaced_role,
                        namespace,
                        role,
                        ("rules",),
                    )
                    self._upsert(
                        self.rbac.read_namespaced_role_binding,
                        self.rbac.create_namespaced_role_binding,
                        self.rbac.replace_namespaced_role_binding,
                        namespace,
                        binding,
                        ("subjects", "roleRef"),
                    )
                except NotOurs as conflict:
                    conflicts[role["metadata"]["name"]] = str(conflict)
            wanted = {item["metadata"]["name"] for item in (*roles, *bindings)}
            selector = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
            for listing, delete in (
                (self.rbac.list_namespaced_role_binding, self.rbac.delete_namespaced_role_binding),
                (self.rbac.list_namespaced_role, self.rbac.delete_namespaced_role),
            ):
                for item in listing(namespace, label_selector=selector).items:
                    stale = item.metadata.name
                    if stale.startswith(contract.HOLDER_ROLE) and stale not in wanted:
                        try:
                            delete(stale, namespace)
                        except kubernetes.client.ApiException as error:
                            if error.status != 404:
                                raise
        if conflicts:
            raise NotOurs("; ".join(conflicts.values()), conflicts)

    def _upsert(
        self,
        read: Any,
        create: Any,
        replace: Any,
        namespace: str,
        desired: dict[str, Any],
        fields: tuple[str, ...],
    ) -> bool:
        name = desired["metadata"]["name"]
        try:
            current = raw(read(name, namespace, _preload_content=False))
        except kubernetes.client.ApiException as error:
            if error.status != 404:
                raise
            done(create(namespace, desired, _preload_content=False))
            return True
        if not _made_by_cronlock(current):
            kind = "RoleBinding" if "roleRef" in desired else "Role"
            raise NotOurs(
                f"{kind} {namespace}/{name} exists and was not made by cronlock (it lacks the "
                f"label {contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}); cronlock leaves it "
                "as it is, so runs of this ServiceAccount get no holder access: rename or "
                f"delete that {kind}, or give the CronJob another serviceAccountName"
            )
        if all(current.get(key) == desired[key] for key in fields) and (
            (current["metadata"].get("labels") or {}).items()
            >= desired["metadata"]["labels"].items()
        ):
            return False
        desired = {
            **desired,
            "metadata": {
                **desired["metadata"],
                "resourceVersion": current["metadata"]["resourceVersion"],
            },
        }
        done(replace(name, namespace, desired, _preload_content=False))
        return True

    # --- Jobs ----------------------------------------------------------------------
    def mark_job(self, namespace: str, name: str, annotation: str, value: str) -> bool:
        """Annotate a Job once; False when it is gone."""
        return self._patch(
            self.batch.patch_namespaced_job,
            "annotate job",
            namespace,
            name,
            {"metadata": {"annotations": {annotation: value}}},
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
        refused: tuple[int, ...] = (404,),
    ) -> bool:
        """One patch; False when the API answers one of `refused` (gone, moved on)."""
        with transient_errors(f"{what} {namespace}/{name}"):
            try:
                done(
                    call(name, namespace, body, _content_type=content_type, _preload_content=False)
                )
            except kubernetes.client.ApiException as error:
                if error.status in refused:
                    return False
                raise
        return True

    def delete_job(self, namespace: str, name: str) -> None:
        with transient_errors(f"delete job {namespace}/{name}"):
            try:
                done(
                    self.batch.delete_namespaced_job(
                        name, namespace, propagation_policy="Background", _preload_content=False
                    )
                )
            except kubernetes.client.ApiException as error:
                if error.status != 404:
                    raise

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
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": REPORTING_COMPONENT},
            "reportingComponent": "cronlock.io/operator",
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        with transient_errors(f"post event {reason} on {metadata['namespace']}/{metadata['name']}"):
            done(
                self.core.create_namespaced_event(
                    metadata["namespace"], event, _preload_content=False
                )
            )
        level = logging.WARNING if warning else logging.INFO
        logger.log(level, "%s %s/%s: %s", reason, metadata["namespace"], metadata["name"], message)
