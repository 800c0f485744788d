"""The work queue's keys: what one reconcile is about, typed per kind."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class CronJobKey:
    kind: ClassVar[str] = "cronjob"
    namespace: str
    name: str


@dataclass(frozen=True)
class RunsKey:
    """The finished runs of one CronJob, to be counted."""

    kind: ClassVar[str] = "account"
    namespace: str
    cronjob: str


@dataclass(frozen=True)
class RbacKey:
    """A namespace whose holder Roles may no longer grant exactly its guarded CronJobs'
    Leases."""

    kind: ClassVar[str] = "rbac"
    namespace: str


@dataclass(frozen=True)
class LeaseKey:
    """A Lease whose holder may have stopped renewing."""

    kind: ClassVar[str] = "lease"
    namespace: str
    name: str


@dataclass(frozen=True)
class ContentionKey:
    """A Lease whose contender notes (overlap, replaced-by) changed: to be told."""

    kind: ClassVar[str] = "contention"
    namespace: str
    name: str


@dataclass(frozen=True)
class MissedKey:
    """A guarded CronJob whose ticks are due to be judged (missed runs, NotSucceeding)."""

    kind: ClassVar[str] = "missed"
    namespace: str
    cronjob: str


@dataclass(frozen=True)
class QueueKey:
    """A lock whose queued Jobs (policy: queue) may be due: one to let go, collapse or
    drop."""

    kind: ClassVar[str] = "queue"
    namespace: str
    lock: str


Key = CronJobKey | RbacKey | RunsKey | LeaseKey | ContentionKey | MissedKey | QueueKey
