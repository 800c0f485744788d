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

# spec.leaseTransitions is an int32: a claim writes one more, so this is the last it can.
TRANSITIONS_CEILING = 2**31 - 2


def out_of_range(lease: Mapping[str, Any]) -> list[str]:
    """What a free Lease carries that no cronlock writer would have written, in words."""
    metadata = lease.get("metadata") or {}
    spec = lease.get("spec") or {}
    if spec.get("holderIdentity"):
        return []  # a holder's hold is its own until it ends or is cleared
    problems = []
    transitions = spec.get("leaseTransitions")
    if isinstance(transitions, int) and not 0 <= transitions <= TRANSITIONS_CEILING:
        problems.append(
            f"leaseTransitions {transitions} (the next claim could not add one to it; "
            "fencing tokens start again from 1)"
        )
    annotations = metadata.get("annotations") or {}
    jobs_text = annotations.get(contract.ANNOTATION_REPLACED_JOBS)
    if isinstance(jobs_text, str) and jobs_text:
        jobs = jobs_text.split(",")
        if not annotations.get(contract.ANNOTATION_REPLACED_BY):
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
    problems = out_of_range(lease)
    if not problems:
        return []
    metadata = lease["metadata"]
    spec = lease.get("spec") or {}
    annotations = metadata.get("annotations") or {}
    patch: list[dict[str, Any]] = [still_at(metadata["resourceVersion"])]
    transitions = spec.get("leaseTransitions")
    if isinstance(transitions, int) and not 0 <= transitions <= TRANSITIONS_CEILING:
        patch.append({"op": "replace", "path": "/spec/leaseTransitions", "value": 0})
    jobs_text = annotations.get(contract.ANNOTATION_REPLACED_JOBS)
    if isinstance(jobs_text, str) and jobs_text:
        path = annotation_path(contract.ANNOTATION_REPLACED_JOBS)
        if not annotations.get(contract.ANNOTATION_REPLACED_BY):
            patch.append({"op": "remove", "path": path})
        elif len(jobs_text.split(",")) > contract.REPLACED_JOBS_KEPT:
            kept = ",".join(jobs_text.split(",")[: contract.REPLACED_JOBS_KEPT])
            patch.append({"op": "replace", "path": path, "value": kept})
    message = (
        f"lease {metadata.get('namespace')}/{metadata.get('name')} carried "
        + "; ".join(problems)
        + ": put back in range. Only the operator, a claim, a release and a yield write these "
        "fields; an admin's edit or a write from before the holders' policy made it"
    )
    return [
        PatchLease(str(metadata.get("namespace")), str(metadata.get("name")), patch),
        *(PostEvent(cronjob, "LeaseRepaired", message, warning=True) for cronjob in owners),
    ]
