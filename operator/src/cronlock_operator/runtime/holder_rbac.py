"""The holder RBAC reconciler: per namespace (`RbacKey`), the Roles and RoleBindings that
let each guarded CronJob's ServiceAccount get and update exactly its locks' Leases.

It reads which CronJobs are guarded, and which are refused for a conflict, through the
CronJob reconciler's read-only `GuardView`, and keeps what it last wrote per namespace:
the guards the Roles grant, and the Roles it could not write because they are not
cronlock's, which it publishes read only (`grants`) as an input of the CronJob decisions.
The two meet only through the queue: a CronJob decision asks for an `RbacKey`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field

from cronlock_operator.cronjob.reading import Readings
from cronlock_operator.kube.cache import ObjectCache
from cronlock_operator.reconcile import cronjobs, rbac
from cronlock_operator.reconcile.guards import GuardView
from cronlock_operator.reconcile.keys import RbacKey
from cronlock_operator.reconcile.rbac import Guard, HolderGrants
from cronlock_operator.runtime.executor import Executor, Refused
from cronlock_operator.runtime.workqueue import DONE, Result
from cronlock_operator.settings import OperatorSettings

logger = logging.getLogger(__name__)


@dataclass
class HolderRbacReconciler:
    """Reconciles `RbacKey`s: brings one namespace's holder Roles in line with its guarded
    CronJobs' locks."""

    settings: OperatorSettings
    executor: Executor
    cronjobs: ObjectCache
    leases: ObjectCache
    # The CronJob reconciler's: guarded as decided, and refused for a conflict (read only).
    guards: GuardView
    readings: Readings
    # Per namespace: the guards the holder Roles grant.
    synced: dict[str, frozenset[Guard]] = field(default_factory=dict)
    # Per namespace: the guards of the last write, made where it could be.
    written: dict[str, frozenset[Guard]] = field(default_factory=dict)
    # Per namespace: holder Role name -> why cronlock could not write it (not cronlock's).
    conflicts: dict[str, dict[str, str]] = field(default_factory=dict)
    _locks: dict[str, threading.Lock] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def grants(self, namespace: str) -> HolderGrants:
        """What the namespace's holder Roles grant, as last written (read only)."""
        return HolderGrants(
            granted=self.synced.get(namespace, frozenset()),
            written=self.written.get(namespace, frozenset()),
            conflicts=dict(self.conflicts.get(namespace, {})),
        )

    def reconcile(self, key: RbacKey) -> Result:
        """The holder Roles of a namespace grant exactly its guarded CronJobs' Leases."""
        namespace = key.namespace
        with self._lock:
            lock = self._locks.setdefault(namespace, threading.Lock())
        with lock:
            guards = set(self.guards.in_namespace(namespace))
            # CronJobs seen but not yet reconciled join now, so a burst writes the Roles once.
            guards |= cronjobs.pending_guards(
                self.cronjobs.in_namespace(namespace),
                self.settings,
                refused=self.guards.refused(),
                leases={
                    str(lease["metadata"]["name"]): lease
                    for lease in self.leases.in_namespace(namespace)
                },
                readings=self.readings,
            )
            desired, actions = rbac.decide(namespace, guards, self.synced.get(namespace))
            if not actions:
                self.written[namespace] = desired
                return DONE
            ran = self.executor.run(actions)
            self.written[namespace] = desired
            if isinstance(ran.verdict, Refused):
                # Written where it could be; the rest waits for the next change (or recheck).
                self.conflicts[namespace] = dict(ran.verdict.names)
                self.synced.pop(namespace, None)
                return DONE
            self.conflicts.pop(namespace, None)
            self.synced[namespace] = desired
            logger.info(
                "holder RBAC in %s: %d leases for %d service accounts",
                namespace,
                len(desired),
                len({guard.service_account for guard in desired}),
            )
        return DONE

    async def sync_all(self, workers: int) -> None:
        """The holder Roles of every namespace with a cached CronJob, `workers` at a time
        (in the default executor), after the start-up list: else the first CronJobs of each
        namespace (listed namespace by namespace) wait on its Role write, one namespace
        after the other."""
        limit = asyncio.Semaphore(workers)

        async def sync(namespace: str) -> None:
            async with limit:
                try:
                    await asyncio.to_thread(self.reconcile, RbacKey(namespace))
                except Exception as error:  # noqa: BLE001 - the CronJobs' reconciles retry
                    logger.warning("holder RBAC in %s not written yet: %s", namespace, error)

        await asyncio.gather(*(sync(namespace) for namespace in self.cronjobs.namespaces()))
