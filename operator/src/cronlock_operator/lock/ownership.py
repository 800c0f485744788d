"""Whose an object is: cronlock's label, a Lease's owners, and the refusal to adopt one.

Pure predicates on objects as the API server sends them; the Kubernetes adapter and the
deciders both ask them, so that the rule is written once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cronlock_operator.errors import NotOurs
from cronlock_sidecar import contract
from cronlock_sidecar.lock.model import read_lease


def made_by_cronlock(obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(contract.LABEL_MANAGED_BY) == contract.MANAGED_BY)


def lease_is_ours(lease: Mapping[str, Any], owner_uid: str, lock: str) -> bool:
    """Labelled as cronlock's Lease for `lock` and owned by this CronJob (among others)."""
    record = read_lease(lease)
    return record.managed and record.lock == lock and owner_uid in record.owner_uids


def refuse_foreign_lease(lease: Mapping[str, Any], lock: str) -> None:
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
