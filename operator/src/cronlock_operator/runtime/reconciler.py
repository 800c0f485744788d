"""The operator's runtime router: watch caches, a typed work queue, and one reconciler per
kind of key.

The kopf event handlers keep the latest CronJobs, Jobs and Leases in memory and enqueue
keys; the queue hands each key to its kind's reconciler, which decides from those caches,
purely (`reconcile/`), has the `Executor` write only what differs (level-triggered, no
writes when idle) and returns a `Result`. The reconcilers: CronJobs (cronjobs.py), holder
RBAC (holder_rbac.py), Lease expiry (lease_expiry.py), finished runs and contender notes
(accounting.py), missed ticks (ticks.py), queued Jobs (dispatch.py). None of them
imports or calls another: they meet through the queue (a reconciler asks for another's
key) and read-only views (the CronJob reconciler's `GuardView`, the holder RBAC's
`GrantView`), wired here.
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

from cronlock_operator.cronjob.reading import Readings
from cronlock_operator.kube.cache import ObjectCache
from cronlock_operator.kube.calls import KubeCalls
from cronlock_operator.kube.errors import NotFound, Rejected, Retry
from cronlock_operator.objects import name_of
from cronlock_operator.reconcile.guards import GuardBook
from cronlock_operator.reconcile.keys import (
    ContentionKey,
    CronJobKey,
    Key,
    LeaseKey,
    MissedKey,
    QueueKey,
    RbacKey,
    RunsKey,
)
from cronlock_operator.reconcile.rbac import HolderGrants
from cronlock_operator.runtime import metrics
from cronlock_operator.runtime.accounting import RunAccounting
from cronlock_operator.runtime.cronjobs import CronJobReconciler
from cronlock_operator.runtime.dispatch import QueueDispatch
from cronlock_operator.runtime.executor import Executor, PostEventCall
from cronlock_operator.runtime.holder_rbac import HolderRbacReconciler
from cronlock_operator.runtime.lease_expiry import LeaseExpiry
from cronlock_operator.runtime.ticks import TickWatch
from cronlock_operator.runtime.workqueue import DONE, Result, WorkQueue
from cronlock_operator.settings import OperatorSettings
from cronlock_sidecar import contract
from cronlock_sidecar.lock.model import LeaseRecord, read_lease
from cronlock_sidecar.lock.permits import permits_of, read_permits

logger = logging.getLogger(__name__)

# Reconciles at once. Each waits mostly on the API server (two writes in a row for a new
# CronJob); more were no faster in the operator benchmark (docs/PERFORMANCE.md).
WORKERS = 4


@dataclass
class Reconciler:
    """The one place watch events and queue keys arrive: it keeps the watch caches and the
    work queue, routes each event to the reconcilers that keep state about it, and each
    key to its kind's reconciler. It decides nothing itself."""

    kube: KubeCalls
    settings: OperatorSettings
    clock: Callable[[], float] = time.monotonic
    # The namespaces the operator watches (empty: all).
    watched_namespaces: frozenset[str] = frozenset()
    cronjobs: ObjectCache = field(default_factory=ObjectCache)
    jobs: ObjectCache = field(default_factory=ObjectCache)
    leases: ObjectCache = field(default_factory=ObjectCache)
    # Each CronJob's reading of its annotations, kept per version for every reader.
    readings: Readings = field(default_factory=Readings)
    # How Events are posted (default: at once, in the worker); see events.EventPoster.
    post_event: PostEventCall | None = None
    queue: WorkQueue[Key] = field(init=False)
    executor: Executor = field(init=False)
    guarding: CronJobReconciler = field(init=False)
    holder_rbac: HolderRbacReconciler = field(init=False)
    expiry: LeaseExpiry = field(init=False)
    # Finished runs and contender notes: read from the caches above, written through the
    # executor.
    accounting: RunAccounting = field(init=False)
    # Each guarded CronJob's ticks: missed runs, runs no longer succeeding.
    ticks: TickWatch = field(init=False)
    # The queues of locks under policy: queue (their suspended Jobs).
    dispatch: QueueDispatch = field(init=False)
    _reconcilers: dict[type, Callable[[Any], Result]] = field(init=False)
    # The event loop the queue runs on, once a reconcile ran there (see _enqueue).
    _loop: asyncio.AbstractEventLoop | None = field(init=False, default=None)
    _loop_thread: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.queue = WorkQueue(self._work, workers=WORKERS)
        self.executor = Executor(
            self.kube, self._cronjob_written, self._lease_written, self.post_event
        )
        # The CronJob reconciler's book: it alone writes it; the holder RBAC and the Lease
        # expiry reconcilers get it as a read-only GuardView.
        book = GuardBook()
        self.expiry = LeaseExpiry(
            self.kube,
            self.settings,
            self.executor,
            self.cronjobs,
            self.leases,
            self.clock,
            guards=book,
        )
        self.holder_rbac = HolderRbacReconciler(
            self.settings, self.executor, self.cronjobs, self.leases, book, self.readings
        )
        self.guarding = CronJobReconciler(
            self.settings,
            self.executor,
            self.cronjobs,
            self.leases,
            grants=self.holder_rbac,
            enqueue=self._enqueue,
            readings=self.readings,
            book=book,
        )
        metrics.count_cronjobs_with(self.guarding.states)
        self.accounting = RunAccounting(
            self.kube,
            self.settings,
            self.executor,
            cronjobs=self.cronjobs,
            jobs=self.jobs,
            leases=self.leases,
            readings=self.readings,
        )
        self.ticks = TickWatch(
            self.settings, self.executor, self.cronjobs, self._frozen, readings=self.readings
        )
        self.dispatch = QueueDispatch(
            self.kube, self.settings, self.executor, self.cronjobs, self.jobs, self.readings
        )
        self._reconcilers = {
            CronJobKey: self.guarding.reconcile,
            RbacKey: self.holder_rbac.reconcile,
            RunsKey: self.accounting.account_runs,
            ContentionKey: self.accounting.tell_contention,
            MissedKey: self.ticks.judge,
            LeaseKey: self.expiry.reconcile,
            QueueKey: self.dispatch.reconcile,
        }

    # --- watch events (event loop thread) ------------------------------------------
    def on_cronjob(self, kind: str | None, body: dict[str, Any]) -> None:
        key = name_of(body)
        if kind == "DELETED":
            self.cronjobs.pop(key)
            self.guarding.deleted(key)
            self.ticks.forget(key)
        else:
            metrics.namespace_seen(key[0])
            self.cronjobs.put(body)
            self.ticks.cronjob_seen(key, body)
            if self.guarding.is_own_patch(key, body):
                return  # the CronJob exactly as our own patch left it: nothing to decide
        self.queue.add(CronJobKey(*key))
        # Any other change in the namespace may settle a conflict there (a team's consent
        # in `share-lock-with`, a lock renamed, a CronJob deleted): the CronJobs refused
        # for one look again now, not only every CONFLICT_RECHECK.
        for other in sorted(self.guarding.refused()):
            if other[0] == key[0] and other != key:
                self.queue.add(CronJobKey(*other))

    def on_namespace(self, kind: str | None, body: dict[str, Any]) -> None:
        """A namespace labelled cronlock.io/enabled=true (the watch's selector), or one that
        left the selector (DELETED: the label removed or changed, or the namespace gone).
        A change re-decides every CronJob there: injected, or reverted."""
        namespace = body["metadata"]["name"]
        labels = body["metadata"].get("labels") or {}
        labelled = kind != "DELETED" and labels.get(contract.LABEL_NAMESPACE_ENABLED) == "true"
        if not self._watches(namespace):
            return  # outside the operator's namespaces: no CronJob of it is seen here
        if not self.readings.set_labelled(namespace, labelled):
            return
        logger.info(
            "namespace %s %s the label %s=true: deciding its CronJobs again",
            namespace,
            "has" if labelled else "no longer has",
            contract.LABEL_NAMESPACE_ENABLED,
        )
        for key in self.cronjobs.keys_in(namespace):
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
        queued = self.dispatch.job_seen(body)
        if queued is not None:
            self.queue.add(queued)

    def on_lease(self, kind: str | None, body: dict[str, Any]) -> None:
        key = name_of(body)
        record = read_lease(body)
        # Leases made before the lock label existed get it at their CronJob's next reconcile.
        lock = contract.lock_of(key[1], record.lock)
        if kind == "DELETED":
            self.leases.pop(key)
            self.expiry.lease_deleted(key)
            self.accounting.lease_deleted(key)
            metrics.forget_lock(key[0], lock)
            # A guarded CronJob still needs it: its reconcile creates it again.
            for owner in body["metadata"].get("ownerReferences") or []:
                if owner.get("kind") == "CronJob":
                    self.queue.add(CronJobKey(key[0], owner["name"]))
            return
        self.leases.put(_lease_entry(body))
        metrics.lock_seen(key[0], lock)
        repair = self.expiry.lease_seen(key, body, record)
        metrics.lease_held.labels(key[0], lock).set(1 if _held(body, record) else 0)
        metrics.set_frozen(
            key[0], lock, record.frozen_until.timestamp() if record.frozen_until else None
        )
        if self.accounting.lease_seen(key, record, lock):
            self.queue.add(ContentionKey(*key))
        if repair:
            self.queue.add(LeaseKey(*key))
        queued = self.dispatch.lease_seen(key[0], lock, body)
        if queued is not None:
            self.queue.add(queued)

    def check_expiry(self) -> None:
        """Enqueue every Lease whose holder has not renewed for longer than its duration."""
        for key in self.expiry.overdue():
            self.queue.add(LeaseKey(*key))

    def check_ticks(self) -> None:
        """Enqueue every guarded CronJob whose next tick is past its deadline."""
        for namespace, name in self.ticks.due():
            self.queue.add(MissedKey(namespace, name))

    def _frozen(self, namespace: str, lock: str) -> bool:
        freeze = self.accounting.freezes.get((namespace, lock))
        return freeze is not None and freeze.until > datetime.datetime.now(datetime.UTC)

    # --- start-up ------------------------------------------------------------------
    def load_labelled_namespaces(self) -> None:
        """Which namespaces opt in, before the first CronJob is decided: without it, each
        CronJob guarded by its namespace's label would be reverted at start, then injected
        again."""
        for namespace in self.kube.labelled_namespaces():
            if self._watches(namespace):
                self.readings.set_labelled(namespace, True)

    def _watches(self, namespace: str) -> bool:
        return not self.watched_namespaces or namespace in self.watched_namespaces

    def load_leases(self, namespaces: Sequence[str]) -> None:
        """Fill the Lease cache before the first holder RBAC sync: a lock's users are read
        from its Lease, and an empty cache would grant every lock to whoever asks."""
        for lease in self.kube.list_leases(namespaces):
            self.leases.put(_lease_entry(lease))

    async def sync_all_rbac(self) -> None:
        """Every namespace's holder Roles, WORKERS at a time, after the start-up list."""
        await self.holder_rbac.sync_all(WORKERS)

    # --- work (worker tasks; the blocking API calls run in threads) -------------------
    async def _work(self, key: Key) -> Result:
        with metrics.reconcile_duration.labels(key.kind).time():
            return await self._reconcile(key)

    def _enqueue(self, key: Key) -> None:
        """A key one reconciler asks for another's. The queue lives on the event loop's
        thread; a reconcile runs in a worker thread, so its keys are handed over."""
        loop = self._loop
        if loop is None or loop.is_closed() or threading.get_ident() == self._loop_thread:
            self.queue.add(key)
        else:
            loop.call_soon_threadsafe(self.queue.add, key)

    def _rbac_written(self, key: RbacKey, before: HolderGrants) -> None:
        """A namespace's holder RBAC reconciled: the CronJobs waiting for it decide again,
        and those refused for a holder Role too when what it could not write changed."""
        waiting = set(self.guarding.waiting(key.namespace))
        if self.holder_rbac.grants(key.namespace).conflicts != before.conflicts:
            waiting |= {name for name in self.guarding.refused() if name[0] == key.namespace}
        for name in sorted(waiting):
            self.queue.add(CronJobKey(*name))

    async def _reconcile(self, key: Key) -> Result:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        before = self.holder_rbac.grants(key.namespace) if isinstance(key, RbacKey) else None
        try:
            result = await asyncio.to_thread(self._reconcilers[type(key)], key)
        except NotFound as gone:
            # The object or its whole namespace is gone; its DELETED event tidies up.
            logger.debug("%s: gone (%s)", key, gone)
            return DONE
        except Rejected as rejected:
            # Terminal (controller-runtime's TerminalError): counted and told, never retried.
            metrics.reconcile_errors.labels(key.namespace, key.kind).inc()
            if isinstance(key, CronJobKey):
                await asyncio.to_thread(
                    self.guarding.report_rejected, key.namespace, key.name, rejected
                )
            return DONE
        except Retry:
            metrics.reconcile_errors.labels(key.namespace, key.kind).inc()
            raise
        except Exception as error:
            # A bug or an input nothing foresaw: counted, told to the CronJob it is about,
            # retried with backoff; the other keys go on as before.
            metrics.reconcile_errors.labels(key.namespace, key.kind).inc()
            if isinstance(key, CronJobKey | RunsKey | MissedKey):
                name = key.name if isinstance(key, CronJobKey) else key.cronjob
                await asyncio.to_thread(self.guarding.report_error, key.namespace, name, error)
            elif isinstance(key, RbacKey):
                # The CronJobs waiting for their holder Role hear why they wait.
                for _, name in sorted(self.guarding.waiting(key.namespace)):
                    await asyncio.to_thread(self.guarding.report_error, key.namespace, name, error)
            raise
        if isinstance(key, RbacKey) and before is not None:
            self._rbac_written(key, before)
        return result

    # --- what the executor tells of our own writes -----------------------------------
    def _cronjob_written(self, body: dict[str, Any]) -> None:
        self.guarding.written(body)

    def _lease_written(self, body: dict[str, Any]) -> None:
        # Until the Lease watch shows it, so the next reconcile does not create it again.
        if name_of(body) not in self.leases:
            self.leases.put(_lease_entry(body))


def _held(lease: Mapping[str, Any], record: LeaseRecord) -> bool:
    """Whether any permit of the lock is held: the spec's, or on a lock of N an entry's."""
    if record.holder:
        return True
    return permits_of(lease) > 1 and any(permit.holder for permit in read_permits(lease))


def _lease_entry(lease: Mapping[str, Any]) -> dict[str, Any]:
    """What the Lease cache keeps: whose it is (labels, owners) and the lock's N permits
    (what its users' consent is judged against), not its holder's renewals, so a renewal
    costs the cache no more than its metadata."""
    metadata = lease["metadata"]
    kept = ("name", "namespace", "labels", "ownerReferences")
    entry = {key: metadata[key] for key in kept if key in metadata}
    count = (metadata.get("annotations") or {}).get(contract.ANNOTATION_PERMITS)
    if count is not None:
        entry["annotations"] = {contract.ANNOTATION_PERMITS: count}
    return {"metadata": entry}
