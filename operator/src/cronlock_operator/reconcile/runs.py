"""The runs reconciler: count a CronJob's finished runs, oldest first, and say what follows.

Each skipped run is a `Skipped` Event and one more consecutive skip; `alert-after` of them
in a row is a `RepeatedSkips` Warning; a successful run resets the count. A run that
overlapped a held lock (observe policy) counts like a skip, since skip would have skipped
it, but keeps its Job; a run replaced by a newer one (replace policy) neither counts nor
resets. A skipped run whose gate said its tick was already worked by another run
(`already ran`, issue 56) is a `TickAlreadyRan` Event, counted apart and not a skip in a
row: nothing is stuck. Each run of a tick (a Job named `<cronjob>-<minutes>`, not a manual
run) is also one tick outcome (`CountTick`); a tick's run that succeeded on a Lease lock is
recorded as the lock's last successful tick (`RecordSuccess`, successes.py). The decision
is pure: the runtime passes the
CronJob, the runs not yet counted and what their gates said, and executes the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from cronlock_operator.cronjob.defaults import Defaults
from cronlock_operator.cronjob.reading import Readings, read_config
from cronlock_operator.reconcile import skips
from cronlock_operator.reconcile.actions import (
    Action,
    AnnotateCronJob,
    CountMaxHoldExceeded,
    CountRun,
    CountTick,
    DeleteJob,
    MarkJob,
    PostEvent,
    RecordSuccess,
    SetConsecutiveSkips,
)
from cronlock_sidecar import contract
from cronlock_sidecar.lock import ticks
from cronlock_sidecar.microtime import format_microtime, read_time


class FrozenLock(NamedTuple):
    """A lock's freeze as its Lease says (`cronlock freeze`)."""

    until: datetime
    by: str
    reason: str


@dataclass(frozen=True)
class CountedRun:
    """One finished run and what counting it writes; the mark comes first."""

    uid: str
    job: str
    actions: list[Action]


@dataclass(frozen=True)
class RunsDecision:
    runs: list[CountedRun]
    after: list[Action]  # the CronJob's counter annotation and gauge


def decide(
    cronjob: Mapping[str, Any],
    finished: Sequence[Mapping[str, Any]],
    settings: Defaults,
    gone: Set[str] = frozenset(),
    *,
    contended: Mapping[str, str] | None = None,
    frozen: Mapping[str, FrozenLock] | None = None,
    readings: Readings,
    already_ran: Mapping[str, str] | None = None,
    max_held: Mapping[str, str] | None = None,
) -> RunsDecision:
    """What counting `finished` (Jobs of this CronJob not yet counted) writes, oldest first.

    Jobs whose uid is in `gone` were deleted before they were counted: they are counted
    from their last state, with nothing written to them. `contended` (Job name ->
    "overlapped" or "replaced") is what the Leases' notes said before any mark on the Job.
    `frozen` (lock -> its freeze) turns a skip that ended while its lock was frozen into a
    `Frozen` Event that counts no skip in a row: a maintenance window is no stuck run.
    `already_ran` (Job name -> its gate's `already ran: ...` line, skips.already_ran_line)
    turns a skip into a `TickAlreadyRan` Event that counts no skip in a row either.
    `max_held` (Job name -> its sidecar's `max-hold exceeded: ...` line,
    skips.max_hold_line) makes a finished run that went through the lock a
    `MaxHoldExceeded` Warning, counted by CronJob; nothing else about it changes.
    """
    metadata = cronjob["metadata"]
    namespace, name = str(metadata["namespace"]), str(metadata["name"])
    # alert-after and keep-skipped-jobs by `read_config`'s rule, as `cronlock status` counts.
    reading = read_config(cronjob, settings, readings)
    alert_after, keep = reading.alert_after, reading.keep_skipped_jobs
    start = count = skips.consecutive_skips(cronjob)
    counted = []
    for job in sorted(finished, key=lambda job: str(job["metadata"].get("creationTimestamp"))):
        job_name = str(job["metadata"]["name"])
        outcome: str | None = (
            skips.contended(job) or (contended or {}).get(job_name) or skips.outcome(job)
        )
        uid = str(job["metadata"].get("uid"))
        present = uid not in gone
        actions: list[Action] = []
        # Only a Job whose cronlock containers are the CronJob's own can have its gate's
        # word taken: a forger's gate may print anything (security review L-N6).
        line = (
            (already_ran or {}).get(job_name)
            if outcome == "skipped" and skips.went_through_the_lock(job, cronjob)
            else None
        )
        if present:
            # A skipped or replaced run's Job ended Failed by cronlock's doing: labelled so
            # (an already-ran one too: it is a skip).
            label = outcome if outcome in contract.LABELLED_OUTCOMES else None
            mark = ALREADY_RAN if line is not None else str(outcome)
            actions.append(MarkJob(namespace, job_name, skips.ACCOUNTED_ANNOTATION, mark, label))
        lock = (job["metadata"].get("labels") or {}).get(contract.LABEL_LOCK, "?")
        freeze = (
            _frozen_when_skipped(job, (frozen or {}).get(lock))
            if outcome == "skipped" and line is None
            else None
        )
        # Right after the mark, as the run's count: what follows may fail after the mark.
        tick = _tick_outcome(job, cronjob, outcome, line, freeze)
        if tick is not None and ticks.tick_of_job(name, job_name) is not None:
            actions.append(CountTick(namespace, name, tick))
        if line is not None:
            # Not a skip in a row: the tick was worked, by another run; no lock is stuck.
            actions.append(CountRun(ALREADY_RAN))
            actions.append(
                PostEvent(cronjob, contract.EVENT_TICK_ALREADY_RAN, f"run {job_name}: {line}")
            )
            if not keep and present:
                actions.append(DeleteJob(namespace, job_name))
        elif freeze is not None:
            actions.append(CountRun("frozen"))
            actions.append(
                PostEvent(
                    cronjob,
                    "Frozen",
                    f"run {job_name} skipped: lock {lock} frozen until "
                    f"{format_microtime(freeze.until)} by {freeze.by}: {freeze.reason}",
                )
            )
            if not keep and present:
                actions.append(DeleteJob(namespace, job_name))
        elif outcome == "succeeded" and skips.went_through_the_lock(job, cronjob):
            count = 0
            at = ticks.tick_of_job(name, job_name)
            ran_on = (job["metadata"].get("labels") or {}).get(contract.LABEL_LOCK)
            config = reading.config
            if at is not None and ran_on and config is not None and not config.shared_store:
                # Last: a Lease that moved on stops only this write.
                actions.append(
                    RecordSuccess(
                        namespace,
                        contract.lease_name(ran_on),
                        name,
                        at,
                        uid,
                        settings.skew_seconds,
                    )
                )
        elif outcome == "queue-timed-out":
            # policy: queue: the run waited, suspended and without a pod, past its
            # queue-timeout, and never ran: a skip like any other (the lock stayed taken).
            count += 1
            actions.append(CountRun("skipped"))
            actions.append(
                PostEvent(
                    cronjob,
                    contract.EVENT_QUEUE_TIMED_OUT,
                    f"run {job_name} skipped: queued longer than its "
                    f"{contract.ANNOTATION_QUEUE_TIMEOUT} while lock {lock} stayed taken, it "
                    f"never ran and was deleted ({count} in a row)",
                    warning=True,
                )
            )
            if count >= alert_after:
                actions.append(_repeated(cronjob, count, lock, "skipped"))
            if present:
                actions.append(DeleteJob(namespace, job_name))
        elif outcome in ("skipped", "overlapped"):
            count += 1
            if outcome == "skipped":
                actions.append(CountRun("skipped"))
                actions.append(
                    PostEvent(
                        cronjob,
                        "Skipped",
                        f"run {job_name} skipped: lock {lock} was held by another run "
                        f"({count} in a row)",
                    )
                )
            if count >= alert_after:
                actions.append(_repeated(cronjob, count, lock, outcome))
            if outcome == "skipped" and not keep and present:
                actions.append(DeleteJob(namespace, job_name))
        held_line = (max_held or {}).get(job_name)
        if (
            held_line is not None
            and outcome in ("succeeded", "failed")
            and skips.went_through_the_lock(job, cronjob)
        ):
            actions.append(CountMaxHoldExceeded(namespace, name))
            actions.append(
                PostEvent(
                    cronjob,
                    contract.EVENT_MAX_HOLD_EXCEEDED,
                    f"run {job_name} held lock {lock} past {contract.ANNOTATION_MAX_HOLD}, "
                    f"so its work was stopped and the lock given back once it ended: {held_line}",
                    warning=True,
                )
            )
        counted.append(CountedRun(uid, job_name, actions))
    after: list[Action] = []
    if count != start:
        value = str(count) if count else None
        after.append(
            AnnotateCronJob(namespace, name, {contract.ANNOTATION_CONSECUTIVE_SKIPS: value})
        )
    after.append(SetConsecutiveSkips(namespace, name, count))
    return RunsDecision(counted, after)


# The runs' and ticks' outcome of a run skipped because its tick was already worked.
ALREADY_RAN = "already_ran"


def _tick_outcome(
    job: Mapping[str, Any],
    cronjob: Mapping[str, Any],
    outcome: str | None,
    line: str | None,
    freeze: FrozenLock | None,
) -> str | None:
    """What became of the run's tick: worked (it succeeded or failed through the lock, or
    overlapped or was replaced while it worked), overlap (skipped: the lock was held),
    already_ran, frozen; None for a run that proves nothing (a Job that never took the
    lock). A Job failed by a gate that could not reach the lock (exit 69) reads as any
    failed Job, so it counts worked: telling it apart would take its pods, which only a
    skip's Failed condition names."""
    if line is not None:
        return ALREADY_RAN
    if freeze is not None:
        return "frozen"
    if outcome in ("skipped", "queue-timed-out"):
        return "overlap"
    if outcome in ("overlapped", "replaced"):
        return "worked"
    if outcome in ("succeeded", "failed") and skips.went_through_the_lock(job, cronjob):
        return "worked"
    return None


def _frozen_when_skipped(job: Mapping[str, Any], freeze: FrozenLock | None) -> FrozenLock | None:
    """`freeze` if the skipped Job ended before it did (its Failed condition's time)."""
    if freeze is None:
        return None
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Failed" and condition.get("status") == "True":
            ended = read_time(condition.get("lastTransitionTime"))
            return freeze if ended is not None and ended < freeze.until else None
    return None


def _repeated(cronjob: Mapping[str, Any], count: int, lock: str, outcome: str) -> PostEvent:
    """The Warning that a run may be stuck: `count` runs in a row found the lock held."""
    namespace = str(cronjob["metadata"]["namespace"])
    why = (
        f"skipped because lock {lock} is held"
        if outcome == "skipped"
        else f"overlapped a run holding lock {lock} (observe policy; under skip they would "
        "have been skipped)"
    )
    return PostEvent(
        cronjob,
        "RepeatedSkips",
        f"{count} runs in a row {why}; a run may be stuck: kubectl get lease -n {namespace} "
        f"{contract.lease_name(lock)}",
        warning=True,
    )
