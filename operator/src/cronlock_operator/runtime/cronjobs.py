"""The CronJob reconciler: guards an opted-in CronJob (its Lease, its holder RBAC, the
injection) or releases one that opted out, and keeps the bookkeeping of guarding.

It keeps which CronJobs are guarded, which refused for a conflict and which for invalid
settings, the Warnings already posted, its own patches' versions and what admission made
of them. `reconcile/cronjobs.py` decides; the executor writes; the holder RBAC and the
Lease expiry reconcilers hear what changed for them.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cronlock_operator.cronjob.reading import Readings
from cronlock_operator.kube.cache import ObjectCache
from cronlock_operator.kube.errors import Rejected
from cronlock_operator.objects import Name, name_of
from cronlock_operator.reconcile import cronjobs
from cronlock_operator.reconcile.cronjobs import Admitted, CronJobDecision
from cronlock_operator.reconcile.keys import CronJobKey
from cronlock_operator.reconcile.rbac import Guard
from cronlock_operator.runtime import metrics
from cronlock_operator.runtime.executor import Executor, Refused, Undecided
from cronlock_operator.runtime.holder_rbac import HolderRbacReconciler
from cronlock_operator.runtime.lease_expiry import LeaseExpiry
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
    holder_rbac: HolderRbacReconciler
    expiry: LeaseExpiry
    # The annotations' readings, kept per version for every reader (cronjob/reading.py).
    readings: Readings
    # Shared with the holder RBAC reconciler, which reads them.
    guards: dict[Name, Guard]
    # CronJobs refused because a Lease or Role they need is not cronlock's.
    conflicted: set[Name]
    # Opted in, but whose latest settings were refused (InvalidConfig): not guarded as asked.
    invalid: set[Name] = field(default_factory=set)
    # Per CronJob uid: the last message of each warning posted, so a replay posts nothing.
    posted: dict[str, dict[str, str]] = field(default_factory=dict)
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

    # --- what the watch and the executor tell it -----------------------------------------
    def is_own_patch(self, key: Name, body: Mapping[str, Any]) -> bool:
        """Whether this watch event is the CronJob exactly as our own patch left it."""
        version = body["metadata"].get("resourceVersion")
        return version is not None and self.own_versions.pop(key, None) == version

    def deleted(self, key: Name) -> None:
        self.own_versions.pop(key, None)

    def written(self, body: dict[str, Any]) -> None:
        """The API server's answer to our patch of a CronJob."""
        version = body["metadata"].get("resourceVersion")
        if version is not None:
            self.own_versions[name_of(body)] = str(version)
        self._answers[name_of(body)] = body

    # --- the reconcile -----------------------------------------------------------------
    def reconcile(self, key: CronJobKey) -> Result:
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
        decision = cronjobs.decide(
            body,
            self.settings,
            previous=self.guards.get(cached),
            cached_lease=lambda lease: self.leases.get((namespace, lease)),
            cached_cronjob=lambda other: self.cronjobs.get((namespace, other)),
            granted=self.holder_rbac.granted(namespace),
            posted=self.posted.get(uid, {}),
            admitted=self.admitted.get(cached),
            readings=self.readings,
        )
        if decision.keep_guard:
            self.invalid.add(cached)
        else:
            self.invalid.discard(cached)
        if not decision.keep_guard and decision.guard is None:
            self.guards.pop(cached, None)
        self.count_states()
        ran = self.executor.run(decision.before)
        match ran.verdict:
            case Refused(reason):
                return self._refused(cached, body, reason)
            case Undecided(reason):
                return Result(retry=reason)
        # Recorded only once its Lease is ensured (consent checked): a holder RBAC sync
        # in another worker meanwhile must not grant a lock this CronJob may not join.
        if not decision.keep_guard and decision.guard is not None:
            self.guards[cached] = decision.guard
            self.count_states()
        if decision.lease_duration_seconds is not None:
            lease = decision.guard.lease if decision.guard is not None else None
            self.expiry.guarded(cached, decision.lease_duration_seconds, lease)
        if decision.sync_rbac:
            self.holder_rbac.sync(namespace)
        if decision.guard is not None and decision.guard.holds:
            conflict = self.holder_rbac.conflict(namespace, decision.guard.service_account)
            if conflict is not None:
                return self._refused(cached, body, conflict)
        self.conflicted.discard(cached)
        self.count_states()
        try:
            self.executor.run(decision.after)
        except Rejected as rejected:
            # Permanent: one Warning and no retry; the CronJob's next change is looked at anew.
            metrics.reconcile_errors.labels(cached[0], CronJobKey.kind).inc()
            message = (
                f"the API server refused cronlock's change: {rejected}; the CronJob is left "
                "as it was"
            )
            self._remember_posted(uid, decision.posted)
            self.warn_once(body, "ReconcileError", message)
            return DONE
        self._remember_posted(uid, {**decision.posted, "ReconcileError": None})
        self._judge_admission(cached, uid, decision)
        return DONE

    def _forget(self, key: Name) -> None:
        """A CronJob gone from the cache: forget it, and take back its Lease's grant."""
        self.conflicted.discard(key)
        self.invalid.discard(key)
        metrics.forget_cronjob(*key)
        self.admitted.pop(key, None)
        self.stripped.discard(key)
        guarded = self.guards.pop(key, None) is not None
        self.count_states()
        if guarded:
            self.holder_rbac.sync(key[0])

    def _judge_admission(self, key: Name, uid: str, decision: CronJobDecision) -> None:
        """What admission made of our patch, if we patched: kept as admitted, said once."""
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
        self.count_states()

    def count_states(self) -> None:
        """The gauge of guarded CronJobs (cronlock_cronjobs is counted when scraped: states)."""
        metrics.guarded_cronjobs.set(len(self.guards))

    def states(self) -> dict[tuple[str, str], int]:
        """(namespace, state) -> CronJobs: guarded as asked, refused settings, conflict.
        Called by a scrape in the metrics server's thread: each set is copied first (one
        step under the GIL), as the reconcile workers go on changing them."""
        guards, invalid = list(self.guards), set(self.invalid)
        conflict = set(self.conflicted) | set(self.stripped)
        counts: collections.Counter[tuple[str, str]] = collections.Counter()
        for namespace, _ in invalid:
            counts[namespace, "invalid"] += 1
        for namespace, _ in conflict:
            counts[namespace, "conflict"] += 1
        for key in guards:
            if key not in invalid and key not in conflict:
                counts[key[0], "guarded"] += 1
        return dict(counts)

    def _refused(self, key: Name, body: Mapping[str, Any], conflict: str) -> Result:
        """Something it needs is not cronlock's: not guarded, one Warning, left as it was,
        and a look again later (someone may fix it meanwhile; not an error)."""
        self.conflicted.add(key)
        self.guards.pop(key, None)
        self.count_states()
        # A grant made ahead of this reconcile (a burst, or the start-up sync) is taken back.
        pending = cronjobs.pending_guard(body, self.settings, self.readings)
        if pending is not None and pending in self.holder_rbac.granted(key[0]):
            self.holder_rbac.sync(key[0])
        self.warn_once(body, "Conflict", conflict + cronjobs.LEFT_AS_IT_WAS)
        return Result(requeue_after=CONFLICT_RECHECK)

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

    def warn_once(self, body: Mapping[str, Any], reason: str, message: str) -> None:
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
