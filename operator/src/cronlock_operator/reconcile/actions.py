"""What a reconciler decided to do, as values, and the one thin executor that does it.

The reconcilers (cronjobs, runs, expiry, rbac) are pure: from cached state they return a
list of these actions. `Executor.run` carries them out in order through `Kube` and the
metrics; a write whose object is gone or moved on stops the rest of its list, since what
follows (an Event saying it happened) would no longer be true.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cronlock_operator.cronjob.config import LockConfig


@dataclass(frozen=True)
class PatchCronJob:
    """A JSON patch of the CronJob (injection or revert); stops the list if it is gone."""

    namespace: str
    name: str
    patch: list[dict[str, Any]]


@dataclass(frozen=True)
class AnnotateCronJob:
    namespace: str
    name: str
    annotations: Mapping[str, str | None]


@dataclass(frozen=True)
class PostEvent:
    involved: Mapping[str, Any]
    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True)
class EnsureLease:
    namespace: str
    name: str
    cronjob: Mapping[str, Any]
    config: LockConfig
    cached: Mapping[str, Any] | None
    # The lock's other users as cached, by name, gathered before deciding: whose consent a
    # new user of the lock needs (one not among them gives none).
    users: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class DropLeaseOwner:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class WriteHolderRbac:
    """The holder Roles and RoleBindings of one namespace, exactly these and no others."""

    namespace: str
    roles: tuple[dict[str, Any], ...]
    bindings: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class MarkJob:
    """Record on the Job that it was counted (a Job already gone is fine); `outcome`, when
    set, is also its `cronlock.io/outcome` label."""

    namespace: str
    name: str
    annotation: str
    value: str
    outcome: str | None = None


@dataclass(frozen=True)
class ResumeJob:
    """Let a queued (suspended) Job go; stops the list if it is gone or already going."""

    namespace: str
    name: str


@dataclass(frozen=True)
class DeleteJob:
    """Delete a Job; with `version`, only that version of it (else the rest of the list
    stops: the Job changed since it was judged)."""

    namespace: str
    name: str
    version: str | None = None


@dataclass(frozen=True)
class PatchLease:
    """A guarded JSON patch of a Lease; stops the list if the Lease moved on."""

    namespace: str
    name: str
    patch: list[dict[str, Any]]


@dataclass(frozen=True)
class RecordSuccess:
    """Run `run` of CronJob `cronjob`'s tick `at` succeeded: record it as the CronJob's
    success record on Lease `name` (reconcile/successes.py `success_patch` judges the Lease
    as read at the write, which applies only while the Lease is that version)."""

    namespace: str
    name: str
    cronjob: str
    at: datetime
    run: str
    skew_seconds: float


@dataclass(frozen=True)
class CountRun:
    result: str  # acquired, skipped, lost, released


@dataclass(frozen=True)
class CountMaxHoldExceeded:
    """A run of the CronJob was stopped at its cronlock.io/max-hold."""

    namespace: str
    cronjob: str


@dataclass(frozen=True)
class CountTakeover:
    namespace: str
    lock: str
    reason: str


@dataclass(frozen=True)
class CountContention:
    kind: str  # overlap, replacement


@dataclass(frozen=True)
class SetConsecutiveSkips:
    namespace: str
    cronjob: str
    count: int


@dataclass(frozen=True)
class CountMissed:
    """Ticks of a CronJob that started no run (reconcile.missed)."""

    namespace: str
    cronjob: str
    ticks: int


@dataclass(frozen=True)
class CountTick:
    """One tick of a CronJob and what became of it: worked, overlap (skipped: the lock was
    held), already_ran (skipped: another run claimed it), frozen. Missed ticks are
    CountMissed's."""

    namespace: str
    cronjob: str
    outcome: str


@dataclass(frozen=True)
class SetRunTimes:
    """A CronJob's next tick and last success (epoch seconds; None: none), and whether its
    runs stopped succeeding (reconcile.missed)."""

    namespace: str
    cronjob: str
    next_run: float | None
    last_success: float | None
    not_succeeding: bool


Action = (
    PatchCronJob
    | AnnotateCronJob
    | PostEvent
    | EnsureLease
    | DropLeaseOwner
    | WriteHolderRbac
    | MarkJob
    | ResumeJob
    | DeleteJob
    | PatchLease
    | RecordSuccess
    | CountRun
    | CountMaxHoldExceeded
    | CountTakeover
    | CountContention
    | SetConsecutiveSkips
    | CountMissed
    | CountTick
    | SetRunTimes
)
