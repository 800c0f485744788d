"""Lease fields out of range, put back by the operator before they can break a lock.

The holders' policy admits `leaseTransitions` only as one more on a claim, and
`cronlock.io/replaced-jobs` only as a yield writes it (its own Job first, at most
`REPLACED_JOBS_KEPT`, with `cronlock.io/replaced-by`). A Lease written before that policy, by
an admin, or where the policy is off can still carry a count at int32's end (every later
claim is then refused by the API server with HTTP 400, so every run fails), a negative one,
or a list of future Jobs (each of which would skip). The operator puts a free Lease back in
range with a guarded patch and tells each owner why, once per repair.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cronlock_operator.objects import annotation_path, still_at
from cronlock_operator.reconcile.actions import Action, PatchLease, PostEvent
from cronlock_sidecar import contract
from cronlock_sidecar.lock.model import LeaseRecord, read_lease, token_set

# spec.leaseTransitions is an int32: a claim writes one more, so this is the last it can.
TRANSITIONS_CEILING = 2**31 - 2


def out_of_range(lease: Mapping[str, Any]) -> list[str]:
    """What a free Lease carries that no cronlock writer would have written, in words."""
    return _problems(read_lease(lease))


def _problems(record: LeaseRecord) -> list[str]:
    if record.holder:
        return []  # a holder's hold is its own until it ends or is cleared
    problems = []
    if not 0 <= record.transitions <= TRANSITIONS_CEILING:
        problems.append(
            f"leaseTransitions {record.transitions} (the next claim could not add one to it; "
            "fencing tokens start again from 1)"
        )
    if record.replaced_jobs_text:
        jobs = record.replaced_jobs_text.split(",")
        if not record.replaced_by:
            problems.append(
                f"{contract.ANNOTATION_REPLACED_JOBS} lists {len(jobs)} Jobs without "
                f"{contract.ANNOTATION_REPLACED_BY} (no yield wrote it)"
            )
        elif len(jobs) > contract.REPLACED_JOBS_KEPT:
            problems.append(
                f"{contract.ANNOTATION_REPLACED_JOBS} lists {len(jobs)} Jobs (a yield keeps "
                f"the newest {contract.REPLACED_JOBS_KEPT})"
            )
    return problems


def decide(lease: Mapping[str, Any], owners: Sequence[Mapping[str, Any]]) -> list[Action]:
    """The repair of `lease` (as just read) and a `LeaseRepaired` Warning per owner; none if
    it is in range. The patch first tests the version read, so a claim in between wins."""
    record = read_lease(lease)
    problems = _problems(record)
    if not problems:
        return []
    patch: list[dict[str, Any]] = [still_at(record.resource_version)]
    if not 0 <= record.transitions <= TRANSITIONS_CEILING:
        patch.append(token_set(0))
    if record.replaced_jobs_text:
        path = annotation_path(contract.ANNOTATION_REPLACED_JOBS)
        jobs = record.replaced_jobs_text.split(",")
        if not record.replaced_by:
            patch.append({"op": "remove", "path": path})
        elif len(jobs) > contract.REPLACED_JOBS_KEPT:
            kept = ",".join(jobs[: contract.REPLACED_JOBS_KEPT])
            patch.append({"op": "replace", "path": path, "value": kept})
    message = (
        f"lease {record.namespace}/{record.name} carried "
        + "; ".join(problems)
        + ": put back in range. Only the operator, a claim, a release and a yield write these "
        "fields; an admin's edit or a write from before the holders' policy made it"
    )
    return [
        PatchLease(record.namespace, record.name, patch),
        *(PostEvent(cronjob, "LeaseRepaired", message, warning=True) for cronjob in owners),
    ]
