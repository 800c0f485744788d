"""What a reconciler decided to do, as values, and the one thin executor that does it.

The reconcilers (cronjobs, runs, expiry, rbac) are pure: from cached state they return a
list of these actions. `Executor.run` carries them out in order through `Kube` and the
metrics; a write whose object is gone or moved on stops the rest of its list, since what
follows (an Event saying it happened) would no longer be true.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cronlock_operator import metrics
from cronlock_operator.config import LockConfig
from cronlock_operator.kube import Kube
from cronlock_operator.sharing import CronJobLookup


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
    # The namespace's cached CronJobs by name: whose consent a new user of the lock needs.
    users: CronJobLookup = field(default=lambda name: None, compare=False, repr=False)


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
    """Record on the Job that it was counted (a Job already gone is fine)."""

    namespace: str
    name: str
    annotation: str
    value: str


@dataclass(frozen=True)
class DeleteJob:
    namespace: str
    name: str


@dataclass(frozen=True)
class PatchLease:
    """A guarded JSON patch of a Lease; stops the list if the Lease moved on."""

    namespace: str
    name: str
    patch: list[dict[str, Any]]


@dataclass(frozen=True)
class CountRun:
    result: str  # acquired, skipped, lost, released


@dataclass(frozen=True)
class CountTakeover:
    reason: str


@dataclass(frozen=True)
class CountContention:
    kind: str  # overlap, replacement


@dataclass(frozen=True)
class SetConsecutiveSkips:
    namespace: str
    cronjob: str
    count: int


Action = (
    PatchCronJob
    | AnnotateCronJob
    | PostEvent
    | EnsureLease
    | DropLeaseOwner
    | WriteHolderRbac
    | MarkJob
    | DeleteJob
    | PatchLease
    | CountRun
    | CountTakeover
    | CountContention
    | SetConsecutiveSkips
)


Written = Callable[[dict[str, Any]], None]
PostEventCall = Callable[[Mapping[str, Any], str, str, bool], None]


def _ignore(body: dict[str, Any]) -> None:
    pass


class Executor:
    """Carries out actions through one `Kube`; nothing here decides anything.

    `cronjob_written` and `lease_written` hear what the API server answered to a CronJob
    patch or a Lease write, so the runtime knows its own writes before the watch shows them.
    """

    def __init__(
        self,
        kube: Kube,
        cronjob_written: Written = _ignore,
        lease_written: Written = _ignore,
        post_event: PostEventCall | None = None,
    ) -> None:
        self.kube = kube
        self.cronjob_written = cronjob_written
        self.lease_written = lease_written
        # By default synchronously; the operator hands Events to its EventPoster.
        self.post_event: PostEventCall = post_event or kube.post_event

    def run(self, actions: Iterable[Action]) -> bool:
        """Every action in order; False when one found its object gone and the rest was dropped."""
        return all(self._one(action) for action in actions)  # all() stops at the first False

    def _one(self, action: Action) -> bool:
        kube = self.kube
        match action:
            case PatchCronJob(namespace, name, patch):
                patched = kube.patch_cronjob(namespace, name, patch)
                if patched is None:
                    return False
                self.cronjob_written(patched)
            case PatchLease(namespace, name, patch):
                return kube.patch_lease(namespace, name, patch)
            case AnnotateCronJob(namespace, name, annotations):
                kube.annotate_cronjob(namespace, name, annotations)
            case PostEvent(involved, reason, message, warning):
                self.post_event(involved, reason, message, warning)
            case EnsureLease(namespace, name, cronjob, config, cached, users):
                written = kube.ensure_lease(namespace, name, cronjob, config, cached, users)
                if written is not None:
                    self.lease_written(written)
            case DropLeaseOwner(namespace, name, uid):
                kube.drop_lease_owner(namespace, name, uid)
            case WriteHolderRbac(namespace, roles, bindings):
                kube.write_holder_rbac(namespace, roles, bindings)
            case MarkJob(namespace, name, annotation, value):
                kube.mark_job(namespace, name, annotation, value)
            case DeleteJob(namespace, name):
                kube.delete_job(namespace, name)
            case CountRun(result):
                metrics.runs.labels(result).inc()
            case CountTakeover(reason):
                metrics.takeovers.labels(reason).inc()
            case CountContention(kind):
                (metrics.overlaps if kind == "overlap" else metrics.replacements).inc()
            case SetConsecutiveSkips(namespace, cronjob, count):
                metrics.consecutive_skips.labels(namespace, cronjob).set(count)
        return True
