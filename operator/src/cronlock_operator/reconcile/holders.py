"""Holds taken by a pod that is no run of the lock, broken by the operator, decided purely.

RBAC grants a lock's Lease to the ServiceAccount its CronJobs run as, and the holders'
policy lets a pod write it only as itself (`<pod name>_<uid8>`), but neither can tell a run
from another pod on that account (a web app on `default`, security review N4): any of them
could claim the free Lease and renew it for ever, and every run would skip. The operator
can tell: a run's pod is owned by a Job that is owned by one of the Lease's CronJobs (the
CronJob controller's Jobs and `kubectl create job --from=cronjob/x` alike). A hold by any
other pod is cleared at once, with a Warning naming it; on a lock of N permits, so is
each permit entry such a pod holds.

An identity that names no pod (`cronlock-sidecar run` outside Kubernetes writes
`<host>_<pid>_<random>`, and a pod name never has `_`) is left alone: under the holders'
policy no pod can write one, so its writer is a user the policy does not judge (an
admin, a CI job with its own credentials), trusted by RBAC as before. So is a pod that is
gone or was replaced under its name: its token died with it, and the hold ends as any
unrenewed hold does (reconcile/expiry.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from cronlock_operator.reconcile.actions import Action, CountTakeover, PatchLease, PostEvent
from cronlock_sidecar import contract
from cronlock_sidecar.lock.model import cleared, read_lease
from cronlock_sidecar.lock.permits import cleared_permit

REASON: Final = "ForeignHolder"
# A pod's name: a DNS subdomain (no `_`, so the identity splits at its last one).
_POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_MAX_POD_NAME: Final = 253


def named_pod(identity: str) -> tuple[str, str] | None:
    """The pod name and uid prefix a holder identity names; None if it names no pod."""
    pod, sep, uid = identity.rpartition("_")
    if (
        not sep
        or len(uid) != contract.IDENTITY_UID_CHARS
        or len(pod) > _MAX_POD_NAME
        or not _POD_NAME.fullmatch(pod)
    ):
        return None
    return pod, uid


def controller(body: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The object's owner reference of `kind` that is its controller, if any."""
    for owner in (body.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("kind") == kind and owner.get("controller"):
            return dict(owner)
    return None


def lock_cronjobs(lease: Mapping[str, Any]) -> dict[str, str]:
    """The Lease's CronJobs (the lock's users) by uid: name."""
    return {
        str(owner.get("uid")): str(owner.get("name"))
        for owner in (lease.get("metadata") or {}).get("ownerReferences") or []
        if owner.get("kind") == "CronJob"
    }


def not_a_run(
    pod: Mapping[str, Any], job: Mapping[str, Any] | None, lease: Mapping[str, Any]
) -> str | None:
    """Why `pod` (the holder's, as read) is no run of a CronJob on the Lease's lock; None if
    it is one. `job` is the Job its controller reference names, as read (None: none, or
    gone)."""
    owner = controller(pod, "Job")
    if owner is None:
        return "it is owned by no Job"
    if job is None or (job.get("metadata") or {}).get("uid") != owner.get("uid"):
        return f"its Job {owner.get('name')} does not exist"
    users = lock_cronjobs(lease)
    for job_owner in (job.get("metadata") or {}).get("ownerReferences") or []:
        if job_owner.get("kind") == "CronJob" and job_owner.get("uid") in users:
            return None
    return (
        f"its Job {owner.get('name')} is no run of "
        + (", ".join(sorted(users.values())) or "any CronJob")
        + " (neither scheduled by it nor made by kubectl create job --from=cronjob/...)"
    )


def decide(
    lease: Mapping[str, Any],
    holder: str,
    pod: Mapping[str, Any],
    why: str,
    owners: Sequence[Mapping[str, Any]],
    wall_now: datetime,
    permit: int = 0,
) -> list[Action]:
    """Clear `holder`'s hold of `lease` (as just read; the patch applies only while it is
    still that version and that holder), then a Warning per owning CronJob naming it.
    `permit`: which permit of a lock of N (lock/permits.py; 0 the spec)."""
    record = read_lease(lease)
    metadata = pod.get("metadata") or {}
    account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
    which = f" permit {permit}" if permit else ""
    message = (
        f"lease {record.namespace}/{record.name}{which} was claimed by {holder}: pod "
        f"{metadata.get('name')} (ServiceAccount {account}) is no run of this lock: {why}. "
        "cronlock cleared the hold so that the lock's runs are not skipped. Another pod on "
        "the runs' ServiceAccount may hold their lock: give the CronJob a ServiceAccount of "
        "its own, and look at that pod"
    )
    return [
        PatchLease(
            record.namespace,
            record.name,
            cleared_permit(lease, permit, holder, wall_now)
            if permit
            else cleared(lease, holder, wall_now),
        ),
        CountTakeover(record.namespace, contract.lock_of(record.name, record.lock), "foreign"),
        *(PostEvent(cronjob, REASON, message, warning=True) for cronjob in owners),
    ]
