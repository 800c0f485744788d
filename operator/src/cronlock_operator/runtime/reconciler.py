"""The operator's runtime: watch caches, a typed work queue, and the reconcilers it runs.

The kopf event handlers keep the latest CronJobs, Jobs and Leases in memory and enqueue
keys; each key's reconciler (cronjobs, runs, contention, expiry, rbac) decides from those
caches, purely, and the `Executor` writes only what differs (level-triggered, no writes
when idle). `Reconciler` keeps the caches and the queue, routes each watch event and key,
and keeps the bookkeeping of guarding CronJobs: which are guarded, their holder RBAC,
what each Lease looked like when last seen. Counting runs and telling contention is
`RunAccounting`'s (accounting.py), which it holds and delegates to.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import kubernetes

from cronlock_operator.cache import ObjectCache
from cronlock_operator.errors import NotOurs, Rejected, RequeueAfter, Retry
from cronlock_operator.kube.calls import KubeCalls
from cronlock_operator.lock import sharing
from cronlock_operator.lock.config import MAX_TTL_SECONDS, OperatorSettings
from cronlock_operator.objects import Name, name_of
from cronlock_operator.reconcile import cronjobs, expiry, rbac, repair
from cronlock_operator.reconcile.cronjobs import Admitted
from cronlock_operator.reconcile.expiry import Observations
from cronlock_operator.reconcile.keys import (
    ContentionKey,
    CronJobKey,
    Key,
    LeaseKey,
    MissedKey,
    RunsKey,
)
from cronlock_operator.reconcile.rbac import Guard
from cronlock_operator.runtime import metrics
from cronlock_operator.runtime.accounting import RunAccounting
from cronlock_operator.runtime.executor import Executor, PostEventCall
from cronlock_operator.runtime.ticks import TickWatch
from cronlock_operator.runtime.workqueue import WorkQueue
from cronlock_sidecar import contract
from cronlock_sidecar.lock.model import read_lease

logger = logging.getLogger(__name__)

# Reconciles at once. Each waits mostly on the API server (two writes in a row for a new
# CronJob); more were no faster in the operator benchmark (docs/PERFORMANCE.md).
WORKERS = 4
# How often a CronJob refused for a conflict looks again (someone may have fixed it).
CONFLICT_RECHECK = 60.0


@dataclass
class Reconciler:
    """The operator's runtime state and the one place watch events and queue keys arrive.

    It keeps the watch caches and the work queue, decides nothing itself (the deciders in
    `reconcile/` do), reconciles CronJobs, holder RBAC and expired holds, and hands
    everything about finished runs and contender notes to its `RunAccounting`.
    """

    kube: KubeCalls
    settings: OperatorSettings
    clock: Callable[[], float] = time.monotonic
    cronjobs: ObjectCache = field(default_factory=ObjectCache)
    jobs: ObjectCache = field(default_factory=ObjectCache)
    leases: ObjectCache = field(default_factory=ObjectCache)
    guards: dict[Name, Guard] = field(default_factory=dict)
    # Per guarded CronJob: its lock's lease duration. A hold is judged expired after the
    # longest of its Lease's owners', whatever duration the holder wrote on the Lease.
    lease_durations: dict[Name, int] = field(default_factory=dict)
    observations: Observations = field(default_factory=Observations)
    # Free Leases seen with a field out of range (reconcile/repair.py), to be put back.
    to_repair: set[Name] = field(default_factory=set)
    # Per CronJob uid: the last message of each warning posted, so a replay posts nothing.
    posted: dict[str, dict[str, str]] = field(default_factory=dict)
    # Per namespace: the guards the holder Roles grant.
    synced_rbac: dict[str, frozenset[Guard]] = field(default_factory=dict)
    # Per namespace: holder Role name -> why cronlock could not write it (not cronlock's).
    rbac_conflicts: dict[str, dict[str, str]] = field(default_factory=dict)
    # CronJobs refused because a Lease or Role they need is not cronlock's.
    conflicted: set[Name] = field(default_factory=set)
    # Opted in, but whose latest settings were refused (InvalidConfig): not guarded as asked.
    invalid: set[Name] = field(default_factory=set)
    # The resourceVersion each CronJob had right after our own patch: its watch event then
    # brings nothing to decide (a change by anyone else has another version).
    own_versions: dict[Name, str] = field(default_factory=dict)
    # What admission made of our last patch of a CronJob, where another mutator changed it:
    # not written again while it stays so (reconcile/cronjobs.py, Admitted).
    admitted: dict[Name, Admitted] = field(default_factory=dict)
    # Of those, the opted-in CronJobs whose admitted template has no injection (a mutator
    # takes it out): counted as not guarded (state conflict).
    stripped: set[Name] = field(default_factory=set)
    # The API server's answer to our last patch of a CronJob, until it is judged.
    _answers: dict[Name, dict[str, Any]] = field(default_factory=dict)
    # How Events are posted (default: at once, in the worker); see events.EventPoster.
    post_event: PostEventCall | None = None
    queue: WorkQueue[Key] = field(init=False)
    executor: Executor = field(init=False)
    # Finished runs and contender notes: read from the caches above, written through the
    # executor.
    accounting: RunAccounting = field(init=False)
    # Each guarded CronJob's ticks: missed runs, runs no longer succeeding.
    ticks: TickWatch = field(init=False)
    _rbac_locks: dict[str, threading.Lock] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.queue = WorkQueue(self._work, workers=WORKERS)
        self.executor = Executor(
            self.kube, self._cronjob_written, self._lease_written, self.post_event
        )
        self.accounting = RunAccounting(
            self.kube,
            self.settings,
            self.executor,
            cronjobs=self.cronjobs,
            jobs=self.jobs,
            leases=self.leases,
        )
        self.ticks = TickWatch(self.settings, self.executor, self.cronjobs, self._frozen)

    # --- watch events (event loop thread) ------------------------------------------
    def on_cronjob(self, kind: str | None, body: dict[str, Any]) -> None:
        key = name_of(body)
        if kind == "DELETED":
            self.cronjobs.pop(key)
            self.own_versions.pop(key, None)
            self.lease_durations.pop(key, None)
            self.ticks.forget(key)
        else:
            self.cronjobs.put(body)
            self.ticks.cronjob_seen(key, body)
            version = body["metadata"].get("resourceVersion")
            if version is not None and self.own_versions.pop(key, None) == version:
                return  # the CronJob exactly as our own patch left it: nothing to decide
        self.queue.add(CronJobKey(*key))

    def on_job(self, kind: str | None, body: dict[str, Any]) -> None:
        key = name_of(body)
        if kind == "DELETED":
            self.jobs.pop(key)
            owner = self.accounting.job_deleted(key, body)
        else:
            self.jobs.put(body)
            self.ticks.job_seen(body)
            owner = self.accounting.job_seen(body)
        if owner is not None:
            self.queue.add(RunsKey(key[0], owner))

    def on_lease(self, kind: str | None, body: dict[str, Any]) -> None:
        key = name_of(body)
        record = read_lease(body)
        # Leases made before the lock label existed get it at their CronJob's next reconcile.
        lock = record.lock or key[1].removeprefix(contract.LEASE_PREFIX)
        if kind == "DELETED":
            self.leases.pop(key)
            self.observations.forget(key)
            self.to_repair.discard(key)
            self.accounting.lease_deleted(key)
            metrics.forget_lock(key[0], lock)
            # A guarded CronJob still needs it: its reconcile creates it again.
            for owner in body["metadata"].get("ownerReferences") or []:
                if owner.get("kind") == "CronJob":
                    self.queue.add(CronJobKey(key[0], owner["name"]))
            return
        self.leases.put(_lease_entry(body))
        seen, counts = expiry.observe(
            self.observations.get(key), record, self.clock(), self._longest_duration(body)
        )
        if seen is not None:
            self.executor.run(counts)
            self.observations.put(key, seen)
        metrics.lease_held.labels(key[0], lock).set(1 if record.holder else 0)
        metrics.set_frozen(
            key[0], lock, record.frozen_until.timestamp() if record.frozen_until else None
        )
        if self.accounting.lease_seen(key, record, lock):
            self.queue.add(ContentionKey(*key))
        if record.managed and repair.out_of_range(body):
            self.to_repair.add(key)
            self.queue.add(LeaseKey(*key))

    def _longest_duration(self, lease: Mapping[str, Any]) -> int:
        """The longest lease duration among the Lease's owners as their annotations set it
        (the longest any lock may have while none of them is known yet)."""
        namespace = lease["metadata"]["namespace"]
        durations = [
            duration
            for owner in lease["metadata"].get("ownerReferences") or []
            if owner.get("kind") == "CronJob"
            and (duration := self.lease_durations.get((namespace, owner.get("name")))) is not None
        ]
        return max(durations, default=MAX_TTL_SECONDS)

    def _cap_observed(self, namespace: str, lease_name: str) -> None:
        """A hold first seen before its owners were reconciled was believed for up to the
        longest any lock may have (security review L1); now that an owner's ttl is known,
        believe it only for the longest its owners give."""
        lease = self.leases.get((namespace, lease_name))
        if lease is not None:
            self.observations.cap((namespace, lease_name), self._longest_duration(lease))

    def check_expiry(self) -> None:
        """Enqueue every Lease whose holder has not renewed for longer than its duration."""
        for key in self.observations.overdue(self.clock(), self.settings.skew_seconds):
            self.queue.add(LeaseKey(*key))

    def check_ticks(self) -> None:
        """Enqueue every guarded CronJob whose next tick is past its deadline."""
        for namespace, name in self.ticks.due():
            self.queue.add(MissedKey(namespace, name))

    def _frozen(self, namespace: str, lock: str) -> bool:
        freeze = self.accounting.freezes.get((namespace, lock))
        return freeze is not None and freeze.until > datetime.datetime.now(datetime.UTC)

    # --- work (worker tasks; the blocking API calls run in threads) -------------------
    async def _work(self, key: Key) -> None:
        with metrics.reconcile_duration.labels(key.kind).time():
            await self._reconcile(key)

    async def _reconcile(self, key: Key) -> None:
        try:
            if isinstance(key, CronJobKey):
                await asyncio.to_thread(self.reconcile_cronjob, key.namespace, key.name)
            elif isinstance(key, RunsKey):
                await asyncio.to_thread(self.accounting.account_runs, key.namespace, key.cronjob)
            elif isinstance(key, ContentionKey):
                await asyncio.to_thread(self.accounting.tell_contention, key.namespace, key.name)
            elif isinstance(key, MissedKey):
                await asyncio.to_thread(self.ticks.judge, key.namespace, key.cronjob)
            else:
                await asyncio.to_thread(self.expire_lease, key.namespace, key.name)
        except kubernetes.client.ApiException as error:
            if error.status != 404:
                raise
            # The object or its whole namespace is gone; its DELETED event tidies up.
            logger.debug("%s: gone (%s)", key, error.reason)
        except RequeueAfter:
            raise  # a look again later, not an error
        except Retry:
            metrics.reconcile_errors.labels(key.kind).inc()
            raise
        except Exception as error:
            # A bug or an input nothing foresaw: counted, told to the CronJob it is about,
            # retried with backoff; the other keys go on as before.
            metrics.reconcile_errors.labels(key.kind).inc()
            if isinstance(key, CronJobKey | RunsKey | MissedKey):
                name = key.name if isinstance(key, CronJobKey) else key.cronjob
                await asyncio.to_thread(self._report_error, key.namespace, name, error)
            raise

    def _report_error(self, namespace: str, name: str, error: Exception) -> None:
        body = self.cronjobs.get((namespace, name))
        if body is None:
            return
        message = (
            f"cronlock could not reconcile this CronJob ({type(error).__name__}: {error}); "
            "retrying with backoff, the CronJob is left as it was"
        )
        try:
            self._warn_once(body, "ReconcileError", message)
        except Exception:
            logger.exception("could not post ReconcileError on %s/%s", namespace, name)

    def reconcile_cronjob(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        body = self.cronjobs.get(key)
        if body is None:
            self.conflicted.discard(key)
            self.invalid.discard(key)
            metrics.forget_cronjob(namespace, name)
            self.admitted.pop(key, None)
            self.stripped.discard(key)
            guarded = self.guards.pop(key, None) is not None
            self._count_states()
            if guarded:
                self.sync_rbac(namespace)
            return
        uid = body["metadata"]["uid"]
        decision = cronjobs.decide(
            body,
            self.settings,
            previous=self.guards.get(key),
            cached_lease=lambda lease: self.leases.get((namespace, lease)),
            cached_cronjob=lambda other: self.cronjobs.get((namespace, other)),
            granted=self.synced_rbac.get(namespace, frozenset()),
            posted=self.posted.get(uid, {}),
            admitted=self.admitted.get(key),
        )
        if decision.keep_guard:
            self.invalid.add(key)
        else:
            self.invalid.discard(key)
        if not decision.keep_guard and decision.guard is None:
            self.guards.pop(key, None)
        self._count_states()
        try:
            self.executor.run(decision.before)
            # Recorded only once its Lease is ensured (consent checked): a holder RBAC sync
            # in another worker meanwhile must not grant a lock this CronJob may not join.
            if not decision.keep_guard and decision.guard is not None:
                self.guards[key] = decision.guard
                self._count_states()
            if decision.lease_duration_seconds is not None:
                self.lease_durations[key] = decision.lease_duration_seconds
                if decision.guard is not None:
                    self._cap_observed(namespace, decision.guard.lease)
            if decision.sync_rbac:
                self.sync_rbac(namespace)
            if decision.guard is not None and decision.guard.holds:
                role = rbac.holder_role_name(decision.guard.service_account)
                conflict = self.rbac_conflicts.get(namespace, {}).get(role)
                if conflict is not None:
                    raise NotOurs(conflict)
        except NotOurs as conflict:
            self._refuse(key, body, str(conflict))
            raise RequeueAfter(
                f"cronjob {namespace}/{name}: {conflict}", CONFLICT_RECHECK
            ) from None
        self.conflicted.discard(key)
        self._count_states()
        try:
            self.executor.run(decision.after)
        except Rejected as rejected:
            # Permanent: one Warning and no retry; the CronJob's next change is looked at anew.
            metrics.reconcile_errors.labels(CronJobKey.kind).inc()
            message = (
                f"the API server refused cronlock's change: {rejected}; the CronJob is left "
                "as it was"
            )
            self._remember_posted(uid, decision.posted)
            self._warn_once(body, "ReconcileError", message)
            return
        self._remember_posted(uid, {**decision.posted, "ReconcileError": None})
        answer = self._answers.pop(key, None)
        stripped = decision.stripped
        if decision.desired is not None and answer is not None:
            judged = cronjobs.admission(answer, decision.desired, self.posted.get(uid, {}))
            if judged.admitted is None:
                self.admitted.pop(key, None)
            else:
                self.admitted[key] = judged.admitted
            self.executor.run(judged.actions)
            self._remember_posted(uid, judged.posted)
            stripped = judged.stripped
        if stripped:
            self.stripped.add(key)
        else:
            self.stripped.discard(key)
        self._count_states()

    def _count_states(self) -> None:
        """The gauges of CronJobs by state: guarded as asked, refused settings, conflict."""
        metrics.guarded_cronjobs.set(len(self.guards))
        metrics.set_cronjob_states(
            # Counted over the (few) refused ones: every reconcile calls this, and a set
            # difference over 10,000 guards each time would be quadratic at start-up.
            guarded=len(self.guards)
            - sum(
                1 for key in self.invalid | self.conflicted | self.stripped if key in self.guards
            ),
            invalid=len(self.invalid),
            conflict=len(self.conflicted | self.stripped),
        )

    def _refuse(self, key: Name, body: Mapping[str, Any], conflict: str) -> None:
        """Something it needs is not cronlock's: not guarded, one Warning, left as it was."""
        self.conflicted.add(key)
        self.guards.pop(key, None)
        self._count_states()
        # A grant made ahead of this reconcile (a burst, or the start-up sync) is taken back.
        pending = cronjobs.pending_guard(body, self.settings)
        if pending is not None and pending in self.synced_rbac.get(key[0], frozenset()):
            self.sync_rbac(key[0])
        self._warn_once(body, "Conflict", conflict + "; the CronJob is left as it was")

    def load_leases(self, namespaces: Sequence[str]) -> None:
        """Fill the Lease cache before the first holder RBAC sync: a lock's users are read
        from its Lease, and an empty cache would grant every lock to whoever asks."""
        for lease in self.kube.list_leases(namespaces):
            self.leases.put(_lease_entry(lease))

    async def sync_all_rbac(self) -> None:
        """The holder Roles of every namespace with a cached CronJob, WORKERS at a time (in
        the default executor), after the start-up list: else the first CronJobs of each
        namespace (listed namespace by namespace) wait on its Role write, one namespace
        after the other."""
        limit = asyncio.Semaphore(WORKERS)

        async def sync(namespace: str) -> None:
            async with limit:
                try:
                    await asyncio.to_thread(self.sync_rbac, namespace)
                except Exception as error:  # noqa: BLE001 - the CronJobs' reconciles retry
                    logger.warning("holder RBAC in %s not written yet: %s", namespace, error)

        await asyncio.gather(*(sync(namespace) for namespace in self.cronjobs.namespaces()))

    def sync_rbac(self, namespace: str) -> None:
        """The holder Roles of a namespace grant exactly its guarded CronJobs' Leases."""
        with self._lock:
            lock = self._rbac_locks.setdefault(namespace, threading.Lock())
        with lock:
            guards = {
                guard for (space, _), guard in list(self.guards.items()) if space == namespace
            }
            # CronJobs seen but not yet reconciled join now, so a burst writes the Roles once.
            for body in self.cronjobs.in_namespace(namespace):
                if name_of(body) in self.conflicted:
                    continue
                pending = cronjobs.pending_guard(body, self.settings)
                if pending is not None and self._may_use(namespace, body, pending):
                    guards.add(pending)
            desired, actions = rbac.decide(namespace, guards, self.synced_rbac.get(namespace))
            if not actions:
                return
            try:
                self.executor.run(actions)
            except NotOurs as conflict:
                # Written where it could be; the rest waits for the next change (or recheck).
                self.rbac_conflicts[namespace] = conflict.names
                self.synced_rbac.pop(namespace, None)
                return
            self.rbac_conflicts.pop(namespace, None)
            self.synced_rbac[namespace] = desired
            logger.info(
                "holder RBAC in %s: %d leases for %d service accounts",
                namespace,
                len(desired),
                len({guard.service_account for guard in desired}),
            )

    def _may_use(self, namespace: str, body: Mapping[str, Any], guard: rbac.Guard) -> bool:
        """Whether a CronJob not yet reconciled may be granted its lock's Lease ahead."""
        lease = self.leases.get((namespace, guard.lease))
        if lease is None:
            return True
        lock = guard.lease.removeprefix(contract.LEASE_PREFIX)  # contract.lease_name's inverse
        return sharing.consent(
            lease, body, lock, lambda other: self.cronjobs.get((namespace, other))
        ).granted

    def expire_lease(self, namespace: str, name: str) -> None:
        """Clear a holder that stopped renewing, if it still has not renewed; put a free
        Lease's fields back in range (reconcile/repair.py)."""
        key = (namespace, name)
        seen = self.observations.get(key)
        overdue = seen is not None and seen.overdue(self.clock(), self.settings.skew_seconds)
        if not overdue and key not in self.to_repair:
            return
        self.to_repair.discard(key)
        lease = self.kube.read_lease(namespace, name)
        if lease is None:
            return
        owners = [
            cronjob
            for owner in lease["metadata"].get("ownerReferences") or []
            if owner.get("kind") == "CronJob"
            and (cronjob := self.cronjobs.get((namespace, owner["name"]))) is not None
        ]
        if overdue and seen is not None:
            self.executor.run(
                expiry.decide(
                    seen, lease, owners, self.clock(), datetime.datetime.now(datetime.UTC)
                )
            )
        else:
            self.executor.run(repair.decide(lease, owners))

    def _cronjob_written(self, body: dict[str, Any]) -> None:
        version = body["metadata"].get("resourceVersion")
        if version is not None:
            self.own_versions[name_of(body)] = str(version)
        self._answers[name_of(body)] = body

    def _lease_written(self, body: dict[str, Any]) -> None:
        # Until the Lease watch shows it, so the next reconcile does not create it again.
        if name_of(body) not in self.leases:
            self.leases.put(_lease_entry(body))

    def _warn_once(self, body: Mapping[str, Any], reason: str, message: str) -> None:
        """A Warning on the CronJob, unless this very message is the last one of its reason."""
        uid = body["metadata"]["uid"]
        self.executor.run(cronjobs.once(body, reason, message, self.posted.get(uid, {})))
        self._remember_posted(uid, {reason: message})

    def _remember_posted(self, uid: str, updates: Mapping[str, str | None]) -> None:
        posted = self.posted.setdefault(uid, {})
        for reason, message in updates.items():
            if message is None:
                posted.pop(reason, None)
            else:
                posted[reason] = message
        if not posted:
            del self.posted[uid]


def _lease_entry(lease: Mapping[str, Any]) -> dict[str, Any]:
    """What the Lease cache keeps: whose it is (labels, owners), not its holder's renewals,
    so a renewal costs the cache no more than its metadata."""
    metadata = lease["metadata"]
    kept = ("name", "namespace", "labels", "ownerReferences")
    return {"metadata": {key: metadata[key] for key in kept if key in metadata}}
