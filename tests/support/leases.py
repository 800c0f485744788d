"""Leases for every ring, written by the lock model the code itself uses.

`make_lease()` starts from the Lease the operator makes for a lock (`cronlock-<lock>`,
labelled as cronlock's and with its lock, owned by the CronJobs that use it, only
`leaseDurationSeconds` in its spec) and has `cronlock_sidecar.lock.model` write the rest:
`claimed` for a holder, `renewed` for a later renewal, and the spec `released` leaves once
a hold ended. So a test's Lease has the shape the sidecar and the operator give one. The
names come from the code (`cronlock_sidecar.contract`) because they only build here: what
tests assert stays literal (tests/support/contract.py says why).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from cronlock_sidecar import contract
from cronlock_sidecar.lock import model
from cronlock_sidecar.microtime import format_microtime

# When a Lease is claimed if a test names no time; the sidecar's fake clock starts here too.
MOMENT = datetime(2026, 11, 29, 8, 0, 0, tzinfo=UTC)


def make_lease(
    holder: str = "",
    *,
    lock: str = "report",
    namespace: str = "default",
    acquired: datetime | None = None,
    renewed: datetime | None = None,
    duration: float = contract.DEFAULT_TTL_SECONDS,
    transitions: int | None = None,
    job: str = "",
    annotations: Mapping[str, str] | None = None,
    owners: Sequence[tuple[str, str]] = (),
    labels: Mapping[str, str] | None = None,
    resource_version: str | None = None,
) -> dict[str, Any]:
    """The Lease of `lock` in `namespace` as the API server returns it (its JSON).

    - With a `holder`: claimed by it at `acquired` (by default `renewed`, else MOMENT) for
      a ttl of `duration` seconds, then renewed at `renewed` if that is another time; `job` is
      the Job of the holder's pod.
    - Without one but with a time: an earlier hold's times and no holder, as a release
      leaves the spec (the release's own annotations only if `annotations` has them).
    - Neither: never held.

    `transitions` is its leaseTransitions at the end (by default the claims made here, 0 or
    1). `annotations` go on last, as a contender's note or another writer would add them.
    `owners` are the CronJobs (name, uid) that use it; `labels` replace the operator's
    (`{}`: a Lease cronlock did not make); `resource_version` as the API server would set.
    """
    timing = model.Timing.of(duration)
    body: dict[str, Any] = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": contract.lease_name(lock),
            "namespace": namespace,
            "labels": dict(
                {contract.LABEL_MANAGED_BY: contract.MANAGED_BY, contract.LABEL_LOCK: lock}
                if labels is None
                else labels
            ),
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "CronJob", "name": name, "uid": uid}
                for name, uid in owners
            ],
            "annotations": {},
        },
        "spec": {"leaseDurationSeconds": timing.lease_duration_seconds},
    }
    if resource_version is not None:
        body["metadata"]["resourceVersion"] = resource_version
    claimed_at = acquired or renewed or (MOMENT if holder else None)
    if claimed_at is not None:
        body = model.claimed(body, holder, timing, claimed_at, job)
        if renewed is not None and renewed != claimed_at:
            body = model.renewed(body, timing, renewed)
        if not holder:
            body["spec"] = model.released(body, "", renewed or claimed_at)["spec"]
    if transitions is not None:
        body["spec"]["leaseTransitions"] = transitions
    body["metadata"]["annotations"].update(annotations or {})
    return body


def claim_free_lease(leases: Any, namespace: str, lease: str, identity: str, job: str = "") -> None:
    """A claim of the free Lease `lease` as the holders' policy admits one: as `identity`
    (the writer's own pod), one more transition, for 60 s, naming `job` if given. `leases`
    is a CoordinationV1Api of the writer's token."""
    now = format_microtime(datetime.now(UTC))
    current = leases.read_namespaced_lease(lease, namespace)
    patch: dict[str, Any] = {
        "metadata": {"resourceVersion": current.metadata.resource_version},
        "spec": {
            "holderIdentity": identity,
            "acquireTime": now,
            "renewTime": now,
            "leaseDurationSeconds": 60,
            "leaseTransitions": (current.spec.lease_transitions or 0) + 1,
        },
    }
    if job:
        patch["metadata"]["annotations"] = {contract.ANNOTATION_HOLDER_JOB: job}
    leases.patch_namespaced_lease(lease, namespace, patch)
