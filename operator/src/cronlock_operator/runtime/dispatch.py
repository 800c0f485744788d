"""The queue reconciler (policy: queue): a lock's queued Jobs let go, collapsed or dropped.

It learns of a queued Job from the Job watch (its template's sidecar says `queue`) and of
a release from the Lease watch, and asks for the lock's `QueueKey`. The reconcile reads
the Lease as it is now (a free lock seen in a cache could be taken already), the lock's
Jobs and CronJobs from the watch caches, and has the pure decider (`reconcile/queue.py`)
say what to do; the executor writes. It keeps no queue of its own: the suspended Jobs are
the queue, so a restart loses nothing.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cronlock_operator.cronjob.reading import Readings, read_config
from cronlock_operator.kube.cache import ObjectCache
from cronlock_operator.kube.calls import KubeCalls
from cronlock_operator.reconcile import queue
from cronlock_operator.reconcile.keys import QueueKey
from cronlock_operator.runtime.executor import Executor
from cronlock_operator.runtime.workqueue import DONE, Result
from cronlock_operator.settings import OperatorSettings
from cronlock_sidecar import contract
from cronlock_sidecar.lock.permits import read_permits

logger = logging.getLogger(__name__)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass
class QueueDispatch:
    """Reconciles `QueueKey`s. Its watch methods run on the event loop thread and return
    the key due, if any (the reconciler owns the work queue)."""

    kube: KubeCalls
    settings: OperatorSettings
    executor: Executor
    cronjobs: ObjectCache
    jobs: ObjectCache
    readings: Readings
    now: Callable[[], datetime.datetime] = _now
    # The locks (namespace, lock) that had a queued Job: only their Lease events matter.
    _locks: set[tuple[str, str]] = field(default_factory=set)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    # --- what the watches tell it ------------------------------------------------------
    def job_seen(self, body: Mapping[str, Any]) -> QueueKey | None:
        """A Job made under policy: queue changed (queued, let go, finished, gone)."""
        lock = queue.queue_lock(body)
        if lock is None:
            return None
        namespace = str(body["metadata"]["namespace"])
        with self._guard:
            self._locks.add((namespace, lock))
        return QueueKey(namespace, lock)

    def lease_seen(self, namespace: str, lock: str, body: Mapping[str, Any]) -> QueueKey | None:
        """A queue lock's Lease changed: a permit free now, one of its queued Jobs may go."""
        with self._guard:
            known = (namespace, lock) in self._locks
        if not known or not any(not permit.holder for permit in read_permits(body)):
            return None
        return QueueKey(namespace, lock)

    # --- the reconcile -----------------------------------------------------------------
    def reconcile(self, key: QueueKey) -> Result:
        # The lock's Jobs made under queue (their own sidecar says so): a run of another
        # policy on the same lock is no queue entry, and is never let go or counted here.
        jobs = [
            job
            for job in self.jobs.in_namespace(key.namespace)
            if queue.queue_lock(job) == key.lock
        ]
        timeouts: dict[str, float] = {}
        cronjobs: dict[str, Mapping[str, Any]] = {}
        for name in sorted({owner for job in jobs if (owner := queue.owner_cronjob(job))}):
            cronjob = self.cronjobs.get((key.namespace, name))
            if cronjob is None:
                continue
            config = read_config(cronjob, self.settings, self.readings).config
            if config is not None and config.policy == "queue" and config.lock == key.lock:
                timeouts[name] = config.queue_timeout_seconds
                cronjobs[name] = cronjob
        if not timeouts:
            return DONE
        lease = self.kube.read_lease(key.namespace, contract.lease_name(key.lock))
        if lease is None:
            return DONE  # its CronJob's reconcile makes it; that Lease's event comes back
        decision = queue.decide(lease, jobs, timeouts, cronjobs, self.now())
        for step in decision.steps:
            logger.debug("queue %s/%s: %s", key.namespace, key.lock, step)
            self.executor.run(step)
        if decision.requeue_after is None:
            return DONE
        return Result(requeue_after=max(decision.requeue_after, 0.1))
