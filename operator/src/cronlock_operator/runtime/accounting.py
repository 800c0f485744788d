"""Run accounting: the runtime's memory of finished runs and of Leases' contender notes.

`RunAccounting` owns what the runs and contention reconcilers need remembered between
watch events and reconciles: the finished Jobs deleted before they were counted, the
Jobs this process counted, each Lease's contender notes as last seen and as last told,
and what those notes say happened to runs not yet counted. The decisions themselves are
pure (`reconcile.runs`, `reconcile.contention`); the reconciler routes watch events and
queue keys here and enqueues what these methods say is due.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from cronlock_operator.cronjob.reading import Readings
from cronlock_operator.kube.cache import ObjectCache
from cronlock_operator.kube.calls import KubeCalls
from cronlock_operator.kube.errors import Retry
from cronlock_operator.objects import Name
from cronlock_operator.reconcile import contention, runs, skips
from cronlock_operator.reconcile.keys import ContentionKey, RunsKey
from cronlock_operator.runtime.executor import Executor
from cronlock_operator.runtime.workqueue import DONE, Result
from cronlock_operator.settings import OperatorSettings
from cronlock_sidecar import contract
from cronlock_sidecar.lock.model import LeaseRecord

logger = logging.getLogger(__name__)

# Runs told about by Lease notes before their Job was counted, at most (oldest go first):
# notes are written by pods, and Jobs they name that never come must not pile up.
MAX_CONTENDED = 10_000
# Holder pods remembered per Job (its first pod and its retries'), at most.
MAX_HOLDER_PODS = 8


class RunAccounting:
    """Counts every finished run of a CronJob exactly once and tells what Lease notes say.

    It reads the reconciler's watch caches (never writes them), reads a CronJob through
    `Kube` before counting its runs, and carries the deciders' actions out through the
    `Executor`. Its watch methods run on the event loop thread: `job_seen`, `job_deleted`
    and `lease_seen` return what is due to be enqueued (the reconciler owns the queue),
    `lease_deleted` only forgets. `account_runs` and `tell_contention` run in the workers,
    one key at a time.
    """

    def __init__(
        self,
        kube: KubeCalls,
        settings: OperatorSettings,
        executor: Executor,
        *,
        cronjobs: ObjectCache,
        jobs: ObjectCache,
        leases: ObjectCache,
        readings: Readings,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.executor = executor
        self.cronjobs = cronjobs
        self.jobs = jobs
        self.leases = leases
        self.readings = readings
        # Finished runs deleted before they were counted (the CronJob controller keeps only
        # `failedJobsHistoryLimit` failed Jobs, 1 by default): counted from their last state.
        self.departed: dict[Name, dict[str, Any]] = {}
        # Uids of the Jobs this process has counted, until their deletion is seen: the cache
        # may still show a Job without its mark when the next count runs.
        self.accounted: set[str] = set()
        # Per Lease: its contender notes as last seen, and as last told (contention.py).
        self.notes: dict[Name, contention.Notes] = {}
        self.told: dict[Name, contention.Notes] = {}
        # Per namespace and Job: what the notes say happened to its run, known before the
        # operator's mark on the Job is (a run may finish before it is told).
        self.contended: dict[Name, str] = {}
        # Per namespace and lock: its freeze (`cronlock freeze`), as its Lease last said.
        self.freezes: dict[Name, runs.FrozenLock] = {}
        # Per namespace and Job: the pods its Lease named as holders (cronlock.io/holder-job),
        # whose sidecars may say they stopped the run at cronlock.io/max-hold. The operator
        # may only `get` pods by name, so it learns them from the Lease it watches.
        self.holder_pods: dict[Name, set[str]] = {}

    # --- watch events (event loop thread) ------------------------------------------
    def job_seen(self, job: dict[str, Any]) -> str | None:
        """The CronJob whose runs are due to be counted now that this Job is seen: its
        own, once the Job finished; None while it runs or when it is no CronJob's."""
        return _finished_run_of(job)

    def job_deleted(self, key: Name, job: dict[str, Any]) -> str | None:
        """Forget a deleted Job (already gone from the cache). A finished run not counted
        yet is kept to be counted from its last state, with what the notes said: then
        its CronJob is returned, whose runs are due to be counted."""
        uid = str(job["metadata"].get("uid"))
        if uid in self.accounted:
            self.accounted.discard(uid)
        else:
            owner = _finished_run_of(job)
            if owner is not None and not skips.is_accounted(job):
                self.departed[key] = job
                return owner
        self.contended.pop(key, None)
        return None

    def lease_seen(self, key: Name, record: LeaseRecord, lock: str) -> bool:
        """Remember a Lease's contender notes (`lock` is the lock it is of); True when they
        changed since last seen, so they are due to be told."""
        if record.frozen_until is not None:
            self.freezes[(key[0], lock)] = runs.FrozenLock(
                record.frozen_until, record.frozen_by, record.frozen_reason
            )
        else:
            self.freezes.pop((key[0], lock), None)
        self._remember_holder(key[0], record)
        notes = contention.Notes.of(record)
        if notes == self.notes.get(key, contention.Notes()):
            return False
        self.notes[key] = notes
        for job, what in notes.contended().items():
            cached = self.jobs.get((key[0], job))
            if cached is not None and not contention.is_run_of(cached, lock):
                continue  # another lock's run: a note cannot speak for it
            self.contended[(key[0], job)] = what
        # The oldest go first (dicts keep insertion order).
        while len(self.contended) > MAX_CONTENDED:
            del self.contended[next(iter(self.contended))]
        return True

    def _remember_holder(self, namespace: str, record: LeaseRecord) -> None:
        pod = contract.identity_pod(record.holder)
        if not pod or not record.holder_job:
            return
        pods = self.holder_pods.setdefault((namespace, record.holder_job), set())
        if len(pods) < MAX_HOLDER_PODS:
            pods.add(pod)
        # The oldest Jobs go first (dicts keep insertion order).
        while len(self.holder_pods) > MAX_CONTENDED:
            del self.holder_pods[next(iter(self.holder_pods))]

    def lease_deleted(self, key: Name) -> None:
        """Forget a deleted Lease's notes: a Lease made again starts with none told."""
        self.notes.pop(key, None)
        self.told.pop(key, None)
        self.freezes.pop((key[0], key[1].removeprefix(contract.LEASE_PREFIX)), None)

    # --- work (worker threads) ------------------------------------------------------
    def account_runs(self, runs_of: RunsKey) -> Result:
        """Count the finished runs of one CronJob, oldest first, each exactly once."""
        namespace, cronjob_name = runs_of.namespace, runs_of.cronjob
        cronjob = self.kube.read_cronjob(namespace, cronjob_name)
        if cronjob is None:
            return DONE
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
        frozen = {
            lock: freeze
            for (space, lock), freeze in list(self.freezes.items())
            if space == namespace
        }
        decision = runs.decide(
            cronjob,
            list(candidates.values()),
            self.settings,
            gone,
            contended=contended,
            frozen=frozen,
            readings=self.readings,
            already_ran=self._already_ran(candidates.values()),
            max_held=self._max_held(candidates.values()),
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
                # Seen, perhaps, after this count took it from the cache and before it
                # claimed it (while reading its pod): then its last state waits in
                # `departed`, and would be counted again from there.
                left = self.departed.get(job_key)
                if left is not None and str(left["metadata"].get("uid")) == run.uid:
                    self.departed.pop(job_key, None)
            self.contended.pop(job_key, None)
            self.holder_pods.pop(job_key, None)
        self.executor.run(decision.after)
        return DONE

    def _already_ran(self, jobs: Iterable[dict[str, Any]]) -> dict[str, str]:
        """Per skipped Job whose gate said its tick already ran: the gate's line, read from
        the pod its Failed condition names (one GET each). A pod gone or unreadable leaves
        the Job a skip as before issue 56 (the lock was held)."""
        lines = {}
        for job in jobs:
            if skips.outcome(job) != "skipped":
                continue
            metadata = job["metadata"]
            namespace, name = str(metadata.get("namespace")), str(metadata["name"])
            pod_name = skips.skipped_pod(job)
            if pod_name is None:
                logger.debug("job %s/%s skipped; no pod named: counted as a skip", namespace, name)
                continue
            try:
                pod = self.kube.read_pod(namespace, pod_name)
            except Retry as error:
                logger.debug(
                    "job %s/%s skipped; pod %s unreadable (%s): counted as a skip",
                    namespace,
                    name,
                    pod_name,
                    error,
                )
                continue
            if pod is None:
                logger.debug(
                    "job %s/%s skipped; pod %s gone: counted as a skip", namespace, name, pod_name
                )
                continue
            line = skips.already_ran_line(job, pod)
            if line is not None:
                lines[name] = line
        return lines

    def _max_held(self, jobs: Iterable[dict[str, Any]]) -> dict[str, str]:
        """Per finished run whose sidecar stopped it at max-hold: the sidecar's line, read
        from the pods its Lease named as holders (one GET each). A pod gone or unreadable
        leaves the run without the Warning; the sidecar's log still has the line."""
        lines = {}
        for job in jobs:
            if skips.outcome(job) not in ("succeeded", "failed"):
                continue
            metadata = job["metadata"]
            namespace, name = str(metadata.get("namespace")), str(metadata["name"])
            for pod_name in sorted(self.holder_pods.get((namespace, name), ())):
                try:
                    pod = self.kube.read_pod(namespace, pod_name)
                except Retry as error:
                    logger.debug(
                        "job %s/%s: pod %s unreadable (%s)", namespace, name, pod_name, error
                    )
                    continue
                line = skips.max_hold_line(job, pod)
                if line is not None:
                    lines[name] = line
                    break
        return lines

    def tell_contention(self, lease: ContentionKey) -> Result:
        """Mark, tell and count what a Lease's new contender notes say happened."""
        namespace, name = lease.namespace, lease.name
        key = (namespace, name)
        now = self.notes.get(key)
        if now is None:
            return DONE
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
        return DONE

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


def _finished_run_of(job: dict[str, Any]) -> str | None:
    """The CronJob a finished Job is a run of (None while it runs, or if it is no CronJob's)."""
    owner = skips.owning_cronjob(job)
    if owner is None or skips.outcome(job) is None:
        return None
    return owner
