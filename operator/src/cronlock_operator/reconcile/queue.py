"""The queue of a lock under `policy: queue`, decided purely: which queued Job goes next.

A queued tick is a suspended Job (the injection sets `suspend: true` in the job template,
so the CronJob controller creates each run's Job suspended and the Job controller creates
no pod for it). This decides, from the lock's Lease as just read and its Jobs as cached:

- **Bound**: a Job queued (still suspended) longer than its CronJob's queue timeout is
  marked `cronlock.io/queue-timed-out`; the run accounting (`runs.py`) then counts it as a
  skip (a `QueueTimedOut` Warning, the skips in a row, `RepeatedSkips`) and deletes it.
- **Collapse** (Temporal's BUFFER_ONE): of one CronJob's queued scheduled Jobs only the
  oldest tick is kept; each newer one is deleted with a `Collapsed` Event. Manual runs
  (`kubectl create job --from`) never collapse: each was asked for by someone.
- **Dispatch**: for each permit free (`free_permits`: of the lock's N, lock/permits.py,
  those with no holder; none while frozen) and not taken by a Job let go earlier that is
  still starting (`in_flight`), the oldest queued Job of the lock goes
  (`spec.suspend: false`), across every queue CronJob sharing the lock: by its tick (the
  name the CronJob controller gave it, `ticks.tick_of_job`; a manual run's creation time
  stands for it), then its creation, then its name. With one permit, one at a time, so
  the order holds among queued runs; with N, the N oldest hold before any younger one.

A Job let go is in flight from its start (`status.startTime`, which the Job controller
sets when it is resumed) until its pod is seen holding a permit (its `holder-job` or pod
name on one, or the Lease's `last-holder` after the Job started), the Job finishes, or
`START_BOUND_SECONDS` pass (a pod that never starts must not block the queue for ever).
Only the N let go last can be in flight: each earlier one was judged so before a later
one took its place.
Nothing is remembered between decisions: an operator restart loses no queue state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from cronlock_operator.reconcile.actions import (
    Action,
    DeleteJob,
    MarkJob,
    PostEvent,
    ResumeJob,
)
from cronlock_sidecar import contract
from cronlock_sidecar.lock import ticks
from cronlock_sidecar.lock.durations import format_duration
from cronlock_sidecar.lock.model import LeaseRecord, read_lease
from cronlock_sidecar.lock.permits import Permit, read_permits
from cronlock_sidecar.microtime import read_time

# How long a Job let go may take to hold the lock before the next queued one may go too.
START_BOUND_SECONDS: Final = 120.0
# The Job controller names a Job's pods `<job>-<5 characters>`, the base cut to this many.
_POD_NAME_BASE: Final = 58
_POD_SUFFIX: Final = 5


@dataclass(frozen=True)
class QueueDecision:
    # Each step is run on its own: a Job that changed since it was judged (its delete or
    # resume refused) stops its own step, never another Job's.
    steps: list[list[Action]] = field(default_factory=list)
    # Seconds until a queued Job times out or a Job let go stops counting as starting.
    requeue_after: float | None = None

    @property
    def actions(self) -> list[Action]:
        return [action for step in self.steps for action in step]


def owner_cronjob(job: Mapping[str, Any]) -> str | None:
    """The CronJob that controls the Job (the CronJob controller's Jobs and
    `kubectl create job --from=cronjob/x` alike)."""
    for owner in (job.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("kind") == "CronJob" and owner.get("controller"):
            return str(owner.get("name"))
    return None


def queue_lock(job: Mapping[str, Any]) -> str | None:
    """The lock of a Job made from a template injected under `policy: queue` (its sidecar
    says so), from the Job alone: which Job events concern a queue."""
    lock = ((job.get("metadata") or {}).get("labels") or {}).get(contract.LABEL_LOCK)
    pod_spec = (((job.get("spec") or {}).get("template") or {}).get("spec")) or {}
    for container in pod_spec.get("initContainers") or []:
        if container.get("name") == contract.SIDECAR_CONTAINER:
            for env in container.get("env") or []:
                if env.get("name") == contract.ENV_POLICY and env.get("value") == "queue":
                    return str(lock) if lock else None
    return None


def suspended(job: Mapping[str, Any]) -> bool:
    return (job.get("spec") or {}).get("suspend") is True


def finished(job: Mapping[str, Any]) -> bool:
    """Ended, or marked as queued too long (the run accounting counts and deletes it)."""
    if contract.JOB_ANNOTATION_QUEUE_TIMED_OUT in (
        (job.get("metadata") or {}).get("annotations") or {}
    ):
        return True
    return any(
        condition.get("type") in ("Complete", "Failed", "SuccessCriteriaMet", "FailureTarget")
        and condition.get("status") == "True"
        for condition in (job.get("status") or {}).get("conditions") or []
    )


def created(job: Mapping[str, Any]) -> datetime | None:
    return read_time((job.get("metadata") or {}).get("creationTimestamp"))


def order_key(job: Mapping[str, Any]) -> tuple[datetime, datetime, str]:
    """Oldest first: the Job's tick (a manual run's creation stands for it), its creation,
    its name."""
    metadata = job.get("metadata") or {}
    name = str(metadata.get("name", ""))
    made = created(job) or datetime.max.replace(tzinfo=UTC)
    cronjob = owner_cronjob(job)
    tick = ticks.tick_of_job(cronjob, name) if cronjob else None
    return (tick or made, made, name)


def pod_of(job_name: str, identity: str) -> bool:
    """Whether a holder identity (`<pod>_<uid8>`) names a pod of the Job `job_name`."""
    pod = identity.rpartition("_")[0]
    base = (job_name + "-")[:_POD_NAME_BASE]
    return len(pod) == len(base) + _POD_SUFFIX and pod.startswith(base)


def has_held(job: Mapping[str, Any], record: LeaseRecord, permits: Sequence[Permit] = ()) -> bool:
    """Whether the Job's pod holds a permit of the lock (`permits`; the spec's alone when
    none are given), or released one since the Job was let go."""
    name = str((job.get("metadata") or {}).get("name", ""))
    holders = [(permit.holder, permit.holder_job) for permit in permits] or [
        (record.holder, record.holder_job)
    ]
    if any(job_ == name or (holder and pod_of(name, holder)) for holder, job_ in holders):
        return True
    started = read_time((job.get("status") or {}).get("startTime"))
    return (
        bool(record.last_holder)
        and pod_of(name, record.last_holder)
        and record.released_at is not None
        and (started is None or record.released_at >= started)
    )


def free_permits(lease: Mapping[str, Any], now: datetime) -> int:
    """How many runs could take a permit of the lock now: its permits with no holder (an
    expired one is cleared by the operator first, and its Lease event comes back); none
    while it is frozen."""
    if read_lease(lease).frozen(now):
        return 0
    return sum(1 for permit in read_permits(lease) if not permit.holder)


def in_flight(
    job: Mapping[str, Any], record: LeaseRecord, now: datetime, permits: Sequence[Permit] = ()
) -> float | None:
    """Seconds left of the start-up bound of a Job let go and not yet holding; None when
    the Job is not in flight."""
    if suspended(job) or finished(job) or has_held(job, record, permits):
        return None
    started = read_time((job.get("status") or {}).get("startTime"))
    if started is None:
        return START_BOUND_SECONDS  # resumed, the Job controller has not started it yet
    left = START_BOUND_SECONDS - (now - started).total_seconds()
    return left if left > 0 else None


def decide(
    lease: Mapping[str, Any],
    jobs: Sequence[Mapping[str, Any]],
    timeouts: Mapping[str, float],
    cronjobs: Mapping[str, Mapping[str, Any]],
    now: datetime,
) -> QueueDecision:
    """What to do about the lock's queue. `lease` is its Lease as just read; `jobs` its
    Jobs (label cronlock.io/lock); `timeouts` its CronJobs under queue and their queue
    timeouts (a Job of any other CronJob is not queued here); `cronjobs` those CronJobs'
    bodies, which the Events are about."""
    record = read_lease(lease)
    permits = read_permits(lease)
    # A Job being deleted is gone already (its Events were told when it was deleted).
    ours = [
        job
        for job in jobs
        if owner_cronjob(job) in timeouts
        and not (job.get("metadata") or {}).get("deletionTimestamp")
    ]
    steps: list[list[Action]] = []
    waits: list[float] = []
    queued: list[Mapping[str, Any]] = []
    for job in sorted((job for job in ours if suspended(job) and not finished(job)), key=order_key):
        cronjob = owner_cronjob(job) or ""
        made = created(job)
        age = 0.0 if made is None else (now - made).total_seconds()
        timeout = timeouts[cronjob]
        if age >= timeout:
            # Marked, not deleted here: the run accounting counts it as a skip (a
            # `QueueTimedOut` Warning, the skips in a row, `RepeatedSkips`) and deletes it.
            steps.append(
                [
                    MarkJob(
                        _namespace(job),
                        _name(job),
                        contract.JOB_ANNOTATION_QUEUE_TIMED_OUT,
                        f"queued {format_duration(round(age))}, longer than its "
                        f"{contract.ANNOTATION_QUEUE_TIMEOUT} {format_duration(timeout)}",
                    )
                ]
            )
            continue
        waits.append(timeout - age)
        queued.append(job)
    kept: dict[str, Mapping[str, Any]] = {}
    remaining: list[Mapping[str, Any]] = []
    for job in queued:
        cronjob = owner_cronjob(job) or ""
        if ticks.tick_of_job(cronjob, _name(job)) is None:
            remaining.append(job)  # a manual run: never collapsed
            continue
        older = kept.get(cronjob)
        if older is None:
            kept[cronjob] = job
            remaining.append(job)
            continue
        steps.append(
            _drop(
                job,
                *_event(
                    cronjobs.get(cronjob),
                    contract.EVENT_QUEUE_COLLAPSED,
                    f"job {_name(job)} collapsed into the queued job {_name(older)} of an "
                    "earlier tick (policy: queue keeps one queued tick per CronJob): deleted "
                    "before any pod of it ran",
                ),
            )
        )
    starting = [
        left
        for latest in _latest_let_go(ours, len(permits))
        if (left := in_flight(latest, record, now, permits)) is not None
    ]
    waits.extend(starting)
    slots = free_permits(lease, now) - len(starting)
    lock = record.lock or record.name
    for job in remaining[: max(slots, 0)]:
        cronjob = owner_cronjob(job) or ""
        free = "is free" if len(permits) == 1 else f"has a permit free (of {len(permits)})"
        steps.append(
            [
                ResumeJob(_namespace(job), _name(job)),
                *_event(
                    cronjobs.get(cronjob),
                    contract.EVENT_QUEUE_RELEASED,
                    f"job {_name(job)} let go: the lock {lock} {free} and it was the oldest of "
                    f"{len(remaining)} queued",
                ),
            ]
        )
        waits.append(START_BOUND_SECONDS)
    return QueueDecision(steps, min(waits) if waits else None)


def _latest_let_go(jobs: Sequence[Mapping[str, Any]], count: int) -> list[Mapping[str, Any]]:
    """The `count` Jobs let go last (resumed and not finished; one not started yet is the
    latest). Only they can be in flight: each earlier one was judged no longer starting
    before a later one took its place, and may still be running after it released (its
    pod ending)."""
    let_go = [job for job in jobs if not suspended(job) and not finished(job)]
    never = datetime.max.replace(tzinfo=UTC)
    return sorted(
        let_go,
        key=lambda job: (
            read_time((job.get("status") or {}).get("startTime")) or never,
            created(job) or never,
        ),
        reverse=True,
    )[:count]


def _drop(job: Mapping[str, Any], *then: Action) -> list[Action]:
    """Delete a queued Job, only as the version judged (one let go meanwhile is no longer
    queued, and stays), then tell why."""
    version = (job.get("metadata") or {}).get("resourceVersion")
    return [DeleteJob(_namespace(job), _name(job), str(version) if version else None), *then]


def _event(
    involved: Mapping[str, Any] | None, reason: str, message: str, warning: bool = False
) -> tuple[Action, ...]:
    return () if involved is None else (PostEvent(involved, reason, message, warning),)


def _name(job: Mapping[str, Any]) -> str:
    return str((job.get("metadata") or {}).get("name", ""))


def _namespace(job: Mapping[str, Any]) -> str:
    return str((job.get("metadata") or {}).get("namespace", ""))
