"""The CronJob reconciler: guards an opted-in CronJob (its Lease, the injection, once its
holder Role is written) or releases one that opted out, and keeps the bookkeeping of
guarding.

It keeps, in its `GuardBook`, which CronJobs are guarded, which refused for a conflict and
which for invalid settings, and the Warnings already posted, its own patches' versions
and what admission made of them. `reconcile/cronjobs.py` decides; the executor writes.
It meets the other reconcilers only through the queue and read-only views: it asks for
an `RbacKey` where the holder Roles are due and for a `LeaseKey` where a lease duration
is known, reads the holder grants (`GrantView`), and publishes its book read only
(`GuardView`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from cronlock_operator.cronjob.reading import Readings
from cronlock_operator.kube.cache import ObjectCache
from cronlock_operator.kube.errors import Rejected, Retry
from cronlock_operator.objects import Name, name_of
from cronlock_operator.reconcile import cronjobs
from cronlock_operator.reconcile.cronjobs import Admitted
from cronlock_operator.reconcile.guards import GuardBook, Posted
from cronlock_operator.reconcile.keys import CronJobKey, Key, LeaseKey, RbacKey
from cronlock_operator.reconcile.rbac import GrantView
from cronlock_operator.runtime import metrics
from cronlock_operator.runtime.executor import Executor, Refused, Undecided
from cronlock_operator.runtime.workqueue import DONE, Result
from cronlock_operator.settings import OperatorSettings

logger = logging.getLogger(__name__)

# How often a CronJob refused for a conflict looks again (someone may have fixed it).
CONFLICT_RECHECK = 60.0


@dataclass
class CronJobReconciler:
    """Reconciles `CronJobKey`s from the CronJob cache."""

    settings: OperatorSettings
    executor: Executor
    cronjobs: ObjectCache
    leases: ObjectCache
    # The holder RBAC reconciler's grants, read only: an input of each decision.
    grants: GrantView
    # Asks for another reconciler's key (thread-safe: a worker thread calls it).
    enqueue: Callable[[Key], None]
    # The annotations' readings, kept per version for every reader (cronjob/reading.py).
    readings: Readings
    # Its own, written here alone; the others read it as a GuardView.
    book: GuardBook = field(default_factory=GuardBook)
    # Per CronJob uid: the last message of each warning posted, so a replay posts nothing.
    posted: Posted = field(default_factory=Posted)
    # The resourceVersion each CronJob had right after our own patch: its watch event then
    # brings nothing to decide (a change by anyone else has another version).
    own_versions: dict[Name, str] = field(default_factory=dict)
    # What admission made of our last patch of a CronJob, where another mutator changed it:
    # not written again while it stays so (reconcile/cronjobs.py, Admitted).
    admitted: dict[Name, Admitted] = field(default_factory=dict)
    # The API server's answer to our last patch of a CronJob, until it is judged.
    _answers: dict[Name, dict[str, Any]] = field(default_factory=dict)

    # --- what the watch and the executor tell it -----------------------------------------
    def is_own_patch(self, key: Name, body: Mapping[str, Any]) -> bool:
        """Whether this watch event is the CronJob exactly as our own patch left it."""
        version = body["metadata"].get("resourceVersion")
        return version is not None and self.own_versions.pop(key, None) == version

    def deleted(self, key: Name) -> None:
        self.own_versions.pop(key, None)
        self.book.deleted(key)

    def written(self, body: dict[str, Any]) -> None:
        """The API server's answer to our patch of a CronJob."""
        version = body["metadata"].get("resourceVersion")
        if version is not None:
            self.own_versions[name_of(body)] = str(version)
        self._answers[name_of(body)] = body

    # --- the reconcile -----------------------------------------------------------------
    def reconcile(self, key: CronJobKey) -> Result:
        """Gather, decide once, then carry the decision out: the Lease first; the injection
        only once the holder Role is written (else its first run could not take its
        Lease); a refusal is one Warning and a look again later."""
        namespace, name = key.namespace, key.name
        cached = (namespace, name)
        body = self.cronjobs.get(cached)
        if body is None:
            self._forget(cached)
            return DONE
        if body["metadata"].get("deletionTimestamp"):
            # On its way out: the garbage collector deals with its dependents as the delete
            # asked. A write now could fight it: joining the Lease again right after an
            # orphaning delete dropped the CronJob from its owners left the Lease owned by
            # a deleted CronJob, and the collector deleted it (seen in full runs).
            return DONE
        uid = body["metadata"]["uid"]
        book, posted = self.book, self.posted
        grants = self.grants.grants(namespace)
        # Gathered before deciding: the lock's Lease and its other users, as cached.
        lease_name = cronjobs.lease_needed(body, self.settings, self.readings)
        lease = self.leases.get((namespace, lease_name)) if lease_name else None
        users = {
            user: found
            for user in cronjobs.users_of(lease)
            if (found := self.cronjobs.get((namespace, user))) is not None
        }
        given = cronjobs.CronJobInput(
            body,
            previous=book.guard(cached),
            lease=lease,
            users=MappingProxyType(users),
            grants=grants,
            posted=posted.of(uid),
            admitted=self.admitted.get(cached),
        )
        decision = cronjobs.decide(given, self.settings, readings=self.readings)
        book.settle(cached, invalid=decision.keep_guard, guard=decision.guard)
        self.count_states()
        ran = self.executor.run(decision.before)
        if isinstance(ran.verdict, Undecided):
            raise Retry(ran.verdict.reason)
        refusal = ran.verdict.reason if isinstance(ran.verdict, Refused) else None
        if refusal is None:
            # Recorded only once its Lease is ensured (consent checked): a holder RBAC
            # reconcile meanwhile must not grant a lock this CronJob may not join.
            if not decision.keep_guard and decision.guard is not None:
                book.record(cached, decision.guard)
                self.count_states()
            if decision.lease_duration_seconds is not None:
                book.set_lease_duration(cached, decision.lease_duration_seconds)
                if decision.guard is not None:
                    self.enqueue(LeaseKey(namespace, decision.guard.lease))
            if decision.sync_rbac:
                self.enqueue(RbacKey(namespace))
            book.wait(cached, decision.await_rbac)
            if decision.await_rbac:
                return DONE  # queued again once its namespace's holder RBAC is written
            refusal = decision.conflict
        if refusal is not None:
            # Something it needs is not cronlock's: not guarded, one Warning, left as it
            # was, and a look again later (someone may fix it meanwhile; not an error).
            book.refuse(cached)
            self.count_states()
            # A grant made ahead of this reconcile (a burst, or the start-up sync) is taken
            # back.
            if decision.guard is not None and decision.guard in grants.granted:
                self.enqueue(RbacKey(namespace))
            message = refusal + cronjobs.LEFT_AS_IT_WAS
            self.executor.run(cronjobs.once(body, "Conflict", message, posted.of(uid)))
            posted.remember(uid, {"Conflict": message})
            return Result(requeue_after=CONFLICT_RECHECK)
        book.accept(cached)
        self.count_states()
        try:
            self.executor.run(decision.after)
        except Rejected:
            # Permanent: the reconcile ends here, and the runtime tells it (report_rejected).
            posted.remember(uid, decision.posted)
            raise
        posted.remember(uid, {**decision.posted, "ReconcileError": None})
        # What admission made of our patch, if we patched: kept as admitted, said once.
        answer = self._answers.pop(cached, None)
        stripped = decision.stripped
        if decision.desired is not None and answer is not None:
            judged = cronjobs.admission(answer, decision.desired, posted.of(uid))
            if judged.admitted is None:
                self.admitted.pop(cached, None)
            else:
                self.admitted[cached] = judged.admitted
            self.executor.run(judged.actions)
            posted.remember(uid, judged.posted)
            stripped = judged.stripped
        book.strip(cached, stripped)
        self.count_states()
        return DONE

    def _forget(self, key: Name) -> None:
        """A CronJob gone from the cache: forget it, and take back its Lease's grant."""
        metrics.forget_cronjob(*key)
        self.admitted.pop(key, None)
        guarded = self.book.forget(key)
        self.count_states()
        if guarded:
            self.enqueue(RbacKey(key[0]))

    def count_states(self) -> None:
        """The gauge of guarded CronJobs (cronlock_cronjobs is counted when scraped: states)."""
        metrics.guarded_cronjobs.set(self.book.guarded())

    def states(self) -> dict[tuple[str, str], int]:
        """(namespace, state) -> CronJobs: guarded as asked, refused settings, conflict.
        Called by a scrape in the metrics server's thread: the book copies under its lock."""
        return self.book.states()

    def waiting(self, namespace: str) -> frozenset[Name]:
        """The CronJobs of a namespace waiting for their holder Role to be written."""
        return self.book.waiting(namespace)

    def refused(self) -> frozenset[Name]:
        """The CronJobs refused for a conflict."""
        return self.book.refused()

    def report_error(self, namespace: str, name: str, error: Exception) -> None:
        """A ReconcileError Warning on the CronJob a failed reconcile was about."""
        body = self.cronjobs.get((namespace, name))
        if body is None:
            return
        message = (
            f"cronlock could not reconcile this CronJob ({type(error).__name__}: {error}); "
            "retrying with backoff, the CronJob is left as it was"
        )
        try:
            self.warn_once(body, "ReconcileError", message)
        except Exception:
            logger.exception("could not post ReconcileError on %s/%s", namespace, name)

    def report_rejected(self, namespace: str, name: str, rejected: Rejected) -> None:
        """A ReconcileError Warning on the CronJob the API server refused a change of for
        good: no retry; its next change is looked at anew."""
        body = self.cronjobs.get((namespace, name))
        if body is None:
            return
        message = (
            f"the API server refused cronlock's change: {rejected}; the CronJob is left as it was"
        )
        self.warn_once(body, "ReconcileError", message)

    def warn_once(self, body: Mapping[str, Any], reason: str, message: str) -> None:
        """A Warning on the CronJob, unless this very message is the last one of its reason."""
        uid = body["metadata"]["uid"]
        self.executor.run(cronjobs.once(body, reason, message, self.posted.of(uid)))
        self.posted.remember(uid, {reason: message})
