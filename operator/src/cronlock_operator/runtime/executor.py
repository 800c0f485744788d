"""The one place the deciders' actions are carried out: each write, count or Event, in order."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cronlock_operator.kube.writes import Kube
from cronlock_operator.reconcile.actions import (
    Action,
    AnnotateCronJob,
    CountContention,
    CountRun,
    CountTakeover,
    DeleteJob,
    DropLeaseOwner,
    EnsureLease,
    MarkJob,
    PatchCronJob,
    PatchLease,
    PostEvent,
    SetConsecutiveSkips,
    WriteHolderRbac,
)
from cronlock_operator.runtime import metrics

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
