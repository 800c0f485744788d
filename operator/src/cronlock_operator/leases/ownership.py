"""Whose an object is: cronlock's label, a Lease's owners, the refusal to adopt one, and
what cronlock writes to make a Lease its own or to let one go.

Pure: objects in as the API server sends them, values out. The deciders and the executor
ask these; the Kubernetes adapter only sends what they return.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from cronlock_operator.objects import still_at
from cronlock_sidecar import contract
from cronlock_sidecar.lock.model import read_lease


def made_by_cronlock(obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(contract.LABEL_MANAGED_BY) == contract.MANAGED_BY)


def lease_is_ours(lease: Mapping[str, Any], owner_uid: str, lock: str) -> bool:
    """Labelled as cronlock's Lease for `lock` and owned by this CronJob (among others)."""
    record = read_lease(lease)
    return record.managed and record.lock == lock and owner_uid in record.owner_uids


def foreign_lease(lease: Mapping[str, Any], lock: str) -> str | None:
    """Why a Lease of that name is not cronlock's for `lock` (None when it is): cronlock did
    not make it, or made it for another lock."""
    record = read_lease(lease)
    if record.managed and record.lock in (None, lock):
        return None  # ours (labelled before the lock label existed, or for this very lock)
    why = (
        f"lacks the label {contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
        if not record.managed
        else f"is labelled for lock {record.lock}"
    )
    return (
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


def lease_labels(lock: str) -> dict[str, str]:
    return {contract.LABEL_MANAGED_BY: contract.MANAGED_BY, contract.LABEL_LOCK: lock}


# Where a lock lives, as its Lease says: nothing for a lock in the Lease itself; for a
# lock in Redis or PostgreSQL (whose Lease only registers its users), the store and the
# Secret its CronJobs name. `cronlock freeze` reads it, since a freeze written on a
# registry Lease is one no run reads. And the lock's N permits, when more than one.
StoreMarks = dict[str, str | None]


def store_marks(store: str, secret: str | None, permits: int = 1) -> StoreMarks:
    """The annotations a lock's Lease carries for where it lives and, when more than one,
    how many permits it has (None: absent; an absent N is 1, lock/permits.py)."""
    counted = {contract.ANNOTATION_PERMITS: None if permits == 1 else str(permits)}
    if store == "lease":
        return {
            **dict.fromkeys((contract.ANNOTATION_STORE, contract.ANNOTATION_STORE_SECRET)),
            **counted,
        }
    return {
        contract.ANNOTATION_STORE: store,
        contract.ANNOTATION_STORE_SECRET: secret or "",
        **counted,
    }


def marks_differ(lease: Mapping[str, Any], marks: StoreMarks) -> bool:
    notes = (lease.get("metadata") or {}).get("annotations") or {}
    return any(notes.get(key) != value for key, value in marks.items())


def new_lease(
    name: str,
    cronjob: Mapping[str, Any],
    lock: str,
    duration_seconds: int,
    marks: StoreMarks | None = None,
) -> dict[str, Any]:
    """The Lease a lock nobody uses yet starts as: labelled as cronlock's, owned by the
    CronJob (so the garbage collector deletes it with its last user), no holder, and
    marked with the store the lock lives in, if any."""
    metadata: dict[str, Any] = {
        "name": name,
        "labels": lease_labels(lock),
        "ownerReferences": [owner_reference(cronjob)],
    }
    notes = {key: value for key, value in (marks or {}).items() if value is not None}
    if notes:
        metadata["annotations"] = notes
    return {"metadata": metadata, "spec": {"leaseDurationSeconds": duration_seconds}}


def joining(
    cronjob: Mapping[str, Any], lock: str, marks: StoreMarks | None = None
) -> dict[str, Any]:
    """The strategic merge patch that adds a CronJob to a Lease's users: ownerReferences
    merge by uid, so the other users stay. The store marks as the CronJob asks (every user
    of a lock keeps it in the same place: sharing.consent)."""
    metadata: dict[str, Any] = {
        "labels": lease_labels(lock),
        "ownerReferences": [owner_reference(cronjob)],
    }
    if marks:
        metadata["annotations"] = dict(marks)
    return {"metadata": metadata}


class KeepOwners(NamedTuple):
    """Write the Lease's users without one: a JSON patch that first tests the version read."""

    patch: list[dict[str, Any]]


class DeleteLease(NamedTuple):
    """The last user left: delete the Lease, on the condition it is still at `version`."""

    version: str


def without_owner(lease: Mapping[str, Any] | None, uid: str) -> KeepOwners | DeleteLease | None:
    """What forgetting the CronJob `uid` takes on this Lease; None when nothing (gone, not
    cronlock's to edit or delete, or not among its users)."""
    if lease is None or not made_by_cronlock(lease):
        return None
    metadata = lease["metadata"]
    owners = metadata.get("ownerReferences") or []
    keep = [owner for owner in owners if owner.get("uid") != uid]
    if len(keep) == len(owners):
        return None
    version = str(metadata["resourceVersion"])
    if not keep:
        return DeleteLease(version)
    return KeepOwners(
        [
            still_at(version),
            {"op": "replace", "path": "/metadata/ownerReferences", "value": keep},
        ]
    )
