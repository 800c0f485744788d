"""The one place the deciders' actions are carried out: each write, count or Event, in order.

Four actions depend on what the API server holds at the moment they run, not only on
what the caches showed when they were decided: a Lease created meanwhile by another
CronJob, a Lease's users changed, a Role of the same name someone else made, a Lease whose
claim record moved on. For those the executor reads, asks the pure layer's judge
(`sharing.consent`, `ownership.without_owner`, `rbac.write_for`,
`successes.success_patch`), and sends what the judge returned; the
judges decide, `Kube` only sends. A judge's refusal comes back as a value (`Ran.verdict`:
`Refused`, `Undecided`), for the reconciler to act on; only the API server's errors are
raised (kube/answers.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cronlock_operator.kube.calls import KubeCalls
from cronlock_operator.leases import ownership, sharing
from cronlock_operator.reconcile import rbac
from cronlock_operator.reconcile.actions import (
    Action,
    AnnotateCronJob,
    CountContention,
    CountMaxHoldExceeded,
    CountMissed,
    CountRun,
    CountTakeover,
    CountTick,
    DeleteJob,
    DropLeaseOwner,
    EnsureLease,
    MarkJob,
    PatchCronJob,
    PatchLease,
    PostEvent,
    RecordSuccess,
    ResumeJob,
    SetConsecutiveSkips,
    SetRunTimes,
    WriteHolderRbac,
)
from cronlock_operator.reconcile.rbac import RbacKind
from cronlock_operator.reconcile.successes import success_patch
from cronlock_operator.runtime import metrics
from cronlock_sidecar.lock.ticks import format_tick

logger = logging.getLogger(__name__)

Written = Callable[[dict[str, Any]], None]
PostEventCall = Callable[[Mapping[str, Any], str, str, bool], None]


def _ignore(body: dict[str, Any]) -> None:
    pass


@dataclass(frozen=True)
class Refused:
    """An object cronlock would write exists and is not cronlock's: it is left alone. The
    reason names it and what to do; `names` maps each such object's name to its reason."""

    reason: str
    names: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Undecided:
    """A judge cannot decide yet (a user of the lock not seen yet), or what it judged
    changed meanwhile (a lost race): try again later, with backoff."""

    reason: str


Verdict = Refused | Undecided


@dataclass(frozen=True)
class Ran:
    """What running a list of actions met: `gone` when one found its object gone, and
    `verdict` when a judge refused or could not decide; either stops the rest."""

    gone: bool = False
    verdict: Verdict | None = None

    @property
    def completed(self) -> bool:
        return not self.gone and self.verdict is None


COMPLETED = Ran()
GONE = Ran(gone=True)
# A success record is written on the Lease as read; each renewal in between moves it on.
SUCCESS_TRIES = 3


class Executor:
    """Carries out actions through one `Kube` (any `KubeCalls`); what it writes is what the
    actions, or the pure judges they name, decided.

    `cronjob_written` and `lease_written` hear what the API server answered to a CronJob
    patch or a Lease write, so the runtime knows its own writes before the watch shows them.
    """

    def __init__(
        self,
        kube: KubeCalls,
        cronjob_written: Written = _ignore,
        lease_written: Written = _ignore,
        post_event: PostEventCall | None = None,
    ) -> None:
        self.kube = kube
        self.cronjob_written = cronjob_written
        self.lease_written = lease_written
        # By default synchronously; the operator hands Events to its EventPoster.
        self.post_event: PostEventCall = post_event or kube.post_event

    def run(self, actions: Iterable[Action]) -> Ran:
        """Every action in order, until one finds its object gone or meets a verdict."""
        for action in actions:
            ran = self._one(action)
            if not ran.completed:
                return ran
        return COMPLETED

    def _record_success(self, action: RecordSuccess) -> Ran:
        """The success record written on the Lease as read now, each try on the version
        read; nothing when the Lease is gone or no longer names the run's claim."""
        for _ in range(SUCCESS_TRIES):
            lease = self.kube.read_lease(action.namespace, action.name)
            if lease is None:
                return GONE
            patch = success_patch(
                lease,
                action.cronjob,
                action.at,
                action.run,
                datetime.now(UTC),
                action.skew_seconds,
            )
            if patch is None:
                return COMPLETED
            if self.kube.patch_lease(action.namespace, action.name, patch):
                logger.info(
                    "lease %s/%s: tick %s of %s recorded as its last success (run %s)",
                    action.namespace,
                    action.name,
                    format_tick(action.at),
                    action.cronjob,
                    action.run,
                )
                return COMPLETED
        logger.warning(
            "lease %s/%s: tick %s of %s not recorded as its last success: the Lease changed "
            "under each of %d writes",
            action.namespace,
            action.name,
            format_tick(action.at),
            action.cronjob,
            SUCCESS_TRIES,
        )
        return GONE

    def _one(self, action: Action) -> Ran:
        kube = self.kube
        match action:
            case PatchCronJob(namespace, name, patch):
                patched = kube.patch_cronjob(namespace, name, patch)
                if patched is None:
                    return GONE
                self.cronjob_written(patched)
            case PatchLease(namespace, name, patch):
                return COMPLETED if kube.patch_lease(namespace, name, patch) else GONE
            case RecordSuccess():
                return self._record_success(action)
            case AnnotateCronJob(namespace, name, annotations):
                kube.annotate_cronjob(namespace, name, annotations)
            case PostEvent(involved, reason, message, warning):
                self.post_event(involved, reason, message, warning)
            case EnsureLease():
                return self._ensure_lease(action)
            case DropLeaseOwner(namespace, name, uid):
                return self._drop_lease_owner(namespace, name, uid)
            case WriteHolderRbac(namespace, roles, bindings):
                return self._write_holder_rbac(namespace, roles, bindings)
            case MarkJob(namespace, name, annotation, value, outcome):
                kube.mark_job(namespace, name, annotation, value, outcome=outcome)
            case ResumeJob(namespace, name):
                return COMPLETED if kube.resume_job(namespace, name) else GONE
            case DeleteJob(namespace, name, None):
                kube.delete_job(namespace, name)
            case DeleteJob(namespace, name, version):
                return COMPLETED if kube.delete_job(namespace, name, version) else GONE
            case CountRun(result):
                metrics.runs.labels(result).inc()
            case CountMaxHoldExceeded(namespace, cronjob):
                metrics.max_hold_exceeded.labels(namespace, cronjob).inc()
            case CountTakeover(namespace, lock, reason):
                metrics.takeovers.labels(namespace, lock, reason).inc()
            case CountContention(kind):
                (metrics.overlaps if kind == "overlap" else metrics.replacements).inc()
            case SetConsecutiveSkips(namespace, cronjob, count):
                metrics.consecutive_skips.labels(namespace, cronjob).set(count)
            case CountMissed(namespace, cronjob, ticks):
                metrics.missed_runs.labels(namespace, cronjob).inc(ticks)
                metrics.ticks.labels(namespace, cronjob, "missed").inc(ticks)
            case CountTick(namespace, cronjob, outcome):
                metrics.ticks.labels(namespace, cronjob, outcome).inc()
            case SetRunTimes(namespace, cronjob, next_run, last_success, not_succeeding):
                metrics.set_run_times(namespace, cronjob, next_run, last_success, not_succeeding)
        return COMPLETED

    def _ensure_lease(self, action: EnsureLease) -> Ran:
        """The Lease exists, labelled as ours (and with its lock), owned by this CronJob; a
        Lease other CronJobs use is joined only with their consent. When the cache has not
        seen it, creating is tried first, since that is what a new lock needs."""
        namespace, name, cronjob, lock = (
            action.namespace,
            action.name,
            action.cronjob,
            action.config.lock,
        )
        marks = ownership.store_marks(
            action.config.store, action.config.store_secret, action.config.permits
        )
        consent = sharing.consent(action.cached, cronjob, lock, action.users.get)
        seen = action.cached
        if consent.verdict == "create":
            duration = action.config.timing.lease_duration_seconds
            lease, created = self.kube.create_lease(
                namespace, ownership.new_lease(name, cronjob, lock, duration, marks)
            )
            seen = lease
            # Created, or the cache was behind (409): judged again on what exists.
            consent = (
                sharing.Consent("owned")
                if created
                else sharing.consent(lease, cronjob, lock, action.users.get)
            )
            if consent.verdict == "owned":
                self.lease_written(lease)
        match consent.verdict:
            case "refused":
                return Ran(verdict=Refused(consent.reason))
            case "undecided":
                return Ran(verdict=Undecided(consent.reason))
            case "join":
                self.lease_written(
                    self.kube.merge_lease(namespace, name, ownership.joining(cronjob, lock, marks))
                )
            case "owned" if seen is not None and ownership.marks_differ(seen, marks):
                # Made before Leases were marked, or the lock moved: say where it lives now.
                self.lease_written(
                    self.kube.merge_lease(namespace, name, {"metadata": {"annotations": marks}})
                )
        return COMPLETED

    def _drop_lease_owner(self, namespace: str, name: str, uid: str) -> Ran:
        """Forget a CronJob that no longer uses this Lease; delete it once nobody does. A
        Lease that changed meanwhile is a lost race: Undecided, tried again."""
        match ownership.without_owner(self.kube.read_lease(namespace, name), uid):
            case ownership.KeepOwners(patch):
                if not self.kube.patch_lease(namespace, name, patch):
                    reason = f"lease {namespace}/{name} changed while dropping an owner"
                    return Ran(verdict=Undecided(reason))
            case ownership.DeleteLease(version):
                self.kube.delete_lease(namespace, name, version)
        return COMPLETED

    def _write_holder_rbac(
        self,
        namespace: str,
        roles: Sequence[dict[str, Any]],
        bindings: Sequence[dict[str, Any]],
    ) -> Ran:
        """Exactly these holder Roles and RoleBindings: each written if it differs, and the
        labelled ones no guarded CronJob needs any more deleted. One of the same name that
        cronlock did not make is left alone; the others are written all the same, then
        the verdict `Refused` names the ones left alone."""
        holder = self.kube.holder_rbac
        conflicts: dict[str, str] = {}
        for role, binding in zip(roles, bindings, strict=True):
            pair: tuple[tuple[RbacKind, dict[str, Any]], ...] = (
                ("Role", role),
                ("RoleBinding", binding),
            )
            for kind, desired in pair:
                current = holder.read(kind, namespace, desired["metadata"]["name"])
                write = rbac.write_for(kind, namespace, current, desired)
                if write.verdict == "foreign":
                    conflicts[role["metadata"]["name"]] = write.reason
                    break
                if write.verdict == "create":
                    holder.create(kind, namespace, desired)
                elif write.verdict == "replace" and write.body is not None:
                    holder.replace(kind, namespace, write.body)
        wanted = [item["metadata"]["name"] for item in (*roles, *bindings)]
        stale_kinds: tuple[RbacKind, ...] = ("RoleBinding", "Role")
        for kind in stale_kinds:
            for stale in rbac.stale(holder.labelled(kind, namespace), wanted):
                holder.delete(kind, namespace, stale)
        if conflicts:
            return Ran(verdict=Refused("; ".join(conflicts.values()), conflicts))
        return COMPLETED
