"""One CronJob's reconcile as the work queue runs it, in a unit test's own thread: the keys
it asks for (its namespace's holder RBAC, its Lease's expiry) are reconciled next, and the
CronJob again when it waited for its holder Role."""

from __future__ import annotations

from cronlock_operator.reconcile.keys import CronJobKey, Key, LeaseKey, RbacKey
from cronlock_operator.runtime.reconciler import Reconciler
from cronlock_operator.runtime.workqueue import Result


def reconcile_cronjob(reconciler: Reconciler, namespace: str, name: str) -> Result:
    """Reconcile `namespace/name` and what it asks for, as the queue would, in order."""
    key = CronJobKey(namespace, name)
    result, asked = _asking(reconciler, key)
    if asked and (namespace, name) in reconciler.guarding.waiting(namespace):
        _follow(reconciler, asked)
        result, asked = _asking(reconciler, key)
    _follow(reconciler, asked)
    return result


def _asking(reconciler: Reconciler, key: CronJobKey) -> tuple[Result, list[Key]]:
    asked: list[Key] = []
    enqueue = reconciler.guarding.enqueue
    reconciler.guarding.enqueue = asked.append
    try:
        return reconciler.guarding.reconcile(key), asked
    finally:
        reconciler.guarding.enqueue = enqueue


def _follow(reconciler: Reconciler, asked: list[Key]) -> None:
    for key in dict.fromkeys(asked):
        if isinstance(key, RbacKey):
            reconciler.holder_rbac.reconcile(key)
        elif isinstance(key, LeaseKey):
            reconciler.expiry.reconcile(key)
