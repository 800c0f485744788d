"""Counting finished runs and telling contention: the runs and contention reconcilers'
bookkeeping in the runtime (their decisions are pure, in runs.py and contention.py)."""

from __future__ import annotations

from typing import Any

from cronlock_operator.cache import ObjectCache
from cronlock_operator.kube.writes import Kube
from cronlock_operator.lock.config import OperatorSettings
from cronlock_operator.reconcile import contention, runs, skips
from cronlock_operator.runtime.executor import Executor
from cronlock_sidecar import contract

Name = tuple[str, str]  # (namespace, name)


class RunAccounting:
    """Part of `Reconciler` (reconciler.py), which holds this state."""

    kube: Kube
    settings: OperatorSettings
    executor: Executor
    cronjobs: ObjectCache
    jobs: ObjectCache
    leases: ObjectCache
    departed: dict[Name, dict[str, Any]]
    accounted: set[str]
    notes: dict[Name, contention.Notes]
    told: dict[Name, contention.Notes]
    contended: dict[Name, str]

    def account_runs(self, namespace: str, cronjob_name: str) -> None:
        """Count the finished runs of one CronJob, oldest first, each exactly once."""
        cronjob = self.kube.read_cronjob(namespace, cronjob_name)
        if cronjob is None:
            return
        # Jobs still here, and those deleted before they were counted; one entry per uid
        # (a Job deleted while this runs can be in both).
        candidates: dict[str, dict[str, Any]] = {}
        for key, job in list(self.departed.items()):
            if key[0] == namespace and skips.owning_cronjob(job) == cronjob_name:
                self.departed.pop(key, None)
                candidates[str(job["metadata"].get("uid"))] = job
        gone = frozenset(candidates)
        for job in self.jobs.in_namespace(namespace):
            uid = str(job["metadata"].get("uid"))
            if (
                skips.owning_cronjob(job) == cronjob_name
                and skips.outcome(job) is not None
                and not skips.is_accounted(job)
                and uid not in self.accounted
            ):
                candidates.setdefault(uid, job)
        contended = {
            job: what for (space, job), what in list(self.contended.items()) if space == namespace
        }
        decision = runs.decide(
            cronjob, list(candidates.values()), self.settings, gone, contended=contended
        )
        for run in decision.runs:
            job_key = (namespace, run.job)
            # Claimed before its mark is written: a DELETED event from now on leaves it to us.
            self.accounted.add(run.uid)
            try:
                self.executor.run(run.actions)
            except BaseException:
                self.accounted.discard(run.uid)  # not counted: the retry counts it
                if job_key not in self.jobs:
                    self.departed[job_key] = candidates[run.uid]
                raise
            if job_key not in self.jobs:
                self.accounted.discard(run.uid)  # its deletion was already seen
            self.contended.pop(job_key, None)
        self.executor.run(decision.after)

    def tell_contention(self, namespace: str, name: str) -> None:
        """Mark, tell and count what a Lease's new contender notes say happened."""
        key = (namespace, name)
        now = self.notes.get(key)
        if now is None:
            return
        actions = contention.decide(
            namespace,
            name,
            self.told.get(key, contention.Notes()),
            now,
            lambda job: self._job_named(namespace, job),
            lambda cronjob: self.cronjobs.get((namespace, cronjob)),
            self._lock_of(key),
        )
        self.executor.run(actions)
        self.told[key] = now

    def _lock_of(self, lease: Name) -> str:
        """The lock a cached Lease is of (its label; else its name, as Leases made before
        the label existed)."""
        cached = self.leases.get(lease) or {}
        labels = (cached.get("metadata") or {}).get("labels") or {}
        return str(labels.get(contract.LABEL_LOCK) or lease[1].removeprefix(contract.LEASE_PREFIX))

    def _job_named(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A cached Job by name; one whose pods carry it cut (contention.CUT_JOB_NAME) by prefix."""
        job = self.jobs.get((namespace, name))
        if job is not None or len(name) != contention.CUT_JOB_NAME:
            return job
        matches = [
            other
            for other in self.jobs.in_namespace(namespace)
            if str(other["metadata"]["name"]).startswith(name)
        ]
        return matches[0] if len(matches) == 1 else None
