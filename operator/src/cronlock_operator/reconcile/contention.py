"""The contention reconciler: what the replace and observe policies leave on a Lease, told.

A run under `policy: observe` that found the Lease held notes itself on it
(`cronlock.io/overlap`); a holder that yielded to a `policy: replace` run names it on
release (`cronlock.io/replaced-by`, its own Job first in `cronlock.io/replaced-jobs`).
From each new note this decides, purely, what the operator writes: a mark on the Job
(`cronlock.io/overlapped` or `cronlock.io/replaced-by`, so it is told once and counted
as such when it finishes), an `Overlap` or `Replaced` Event on its CronJob, one count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cronlock_operator.reconcile import skips
from cronlock_operator.reconcile.actions import Action, CountContention, MarkJob, PostEvent
from cronlock_sidecar import contract
from cronlock_sidecar.lock.model import LeaseRecord

Lookup = Callable[[str], Mapping[str, Any] | None]  # a cached object by name, or None
# A Job's pods are named `<job>-` and 5 random characters, that prefix first cut at 58
# characters (the API server's generateName): a longer Job's pods carry its first 58.
CUT_JOB_NAME = 58
_POD_NAME = 63
_SUFFIX = 5


@dataclass(frozen=True)
class Notes:
    """A Lease's contender notes as last seen: the observe run and the holder it overlapped,
    the replace run and the Job it replaced."""

    overlap: str = ""
    overlapped_holder: str = ""
    replaced_by: str = ""
    replaced_job: str = ""

    @classmethod
    def of(cls, record: LeaseRecord) -> Notes:
        return cls(
            overlap=record.overlap,
            overlapped_holder=record.holder if record.overlap else "",
            replaced_by=record.replaced_by,
            replaced_job=record.replaced_jobs[0] if record.replaced_jobs else "",
        )

    def contended(self) -> dict[str, str]:
        """Job name -> what happened to its run ("overlapped", "replaced"), known before
        any mark on the Job."""
        found: dict[str, str] = {}
        overlapping = job_of(self.overlap)
        if overlapping:
            found[overlapping] = "overlapped"
        if self.replaced_job and self.replaced_by:
            found[self.replaced_job] = "replaced"
        return found


def job_of(identity: str) -> str:
    """The Job of a sidecar's identity `<pod>_<uid8>`: the Job's name, or its first 58
    characters when it is longer (then found by prefix); "" if no Job's pod."""
    pod = contract.identity_pod(identity)
    if len(pod) == _POD_NAME:
        return pod[:CUT_JOB_NAME].removesuffix("-")
    if len(pod) > _SUFFIX + 1 and pod[-_SUFFIX - 1] == "-":
        return pod[: -_SUFFIX - 1]
    return ""


def decide(
    namespace: str,
    lease: str,
    seen: Notes,
    now: Notes,
    jobs: Lookup,
    cronjobs: Lookup,
    lock: str,
) -> list[Action]:
    """What telling the notes that changed since `seen` writes (nothing for a replay;
    `Notes()` when none were told yet). A note names a Job; only a Job of this very lock
    (its `cronlock.io/lock` label) is marked and told about: the notes are written by pods,
    and a pod of one lock must not make another lock's runs look replaced or overlapped."""
    actions: list[Action] = []
    where = f"lease {namespace}/{lease}"
    if now.overlap and now.overlap != seen.overlap:
        job, cronjob = _unmarked_run(
            job_of(now.overlap), contract.JOB_ANNOTATION_OVERLAPPED, jobs, cronjobs, lock
        )
        if cronjob is not None:
            holder = now.overlapped_holder or "another run"
            actions += [
                MarkJob(namespace, job, contract.JOB_ANNOTATION_OVERLAPPED, holder),
                PostEvent(
                    cronjob,
                    "Overlap",
                    f"run {job} started while {where} was held by {holder} (observe policy: "
                    "it ran anyway; under skip it would have been skipped)",
                    warning=True,
                ),
                CountContention("overlap"),
            ]
    replaced = (now.replaced_by, now.replaced_job)
    if all(replaced) and replaced != (seen.replaced_by, seen.replaced_job):
        job, cronjob = _unmarked_run(
            now.replaced_job, contract.JOB_ANNOTATION_REPLACED_BY, jobs, cronjobs, lock
        )
        if cronjob is not None:
            newer = job_of(now.replaced_by)
            actions += [
                MarkJob(namespace, job, contract.JOB_ANNOTATION_REPLACED_BY, now.replaced_by),
                PostEvent(
                    cronjob,
                    "Replaced",
                    f"run {job} was stopped and gave up {where}: replaced by "
                    f"{now.replaced_by}"
                    + (f" (run {newer})" if newer else "")
                    + " under the replace policy",
                ),
                CountContention("replacement"),
            ]
    return actions


def _unmarked_run(
    job_name: str, mark: str, jobs: Lookup, cronjobs: Lookup, lock: str
) -> tuple[str, Mapping[str, Any] | None]:
    """A cached Job of `lock` not yet told about and its CronJob; no CronJob if unknown,
    told, or another lock's."""
    job = jobs(job_name) if job_name else None
    if job is None or not is_run_of(job, lock):
        return job_name, None
    metadata = job.get("metadata") or {}
    if mark in (metadata.get("annotations") or {}):
        return job_name, None
    owner = skips.owning_cronjob(job)
    return str(metadata.get("name")), cronjobs(owner) if owner is not None else None


def is_run_of(job: Mapping[str, Any], lock: str) -> bool:
    """Whether a Job is a run guarded by `lock` (its pods hold that lock's Lease)."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    return bool(lock) and labels.get(contract.LABEL_LOCK) == lock
