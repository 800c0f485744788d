"""The missed-runs judge: a tick that started no run, and runs that stopped succeeding.

Skip-if-running can hide a stuck run (`RepeatedSkips` catches that); the quieter failure
is a run that never happens. For each guarded CronJob this judges every tick of its
schedule once it is past its deadline (the CronJob's `startingDeadlineSeconds`, else the
operator's tolerance):

- a tick **started a run** when a Job of the CronJob carries it as its scheduled time
  (`batch.kubernetes.io/cronjob-scheduled-timestamp`, as the CronJob controller writes
  it), or when it is the CronJob's `status.lastScheduleTime`; otherwise it is **missed**:
  one `Missed` Warning per judgment (the CronJob controller was away past the deadline, a
  quota or an admission webhook refused the Job, `spec.suspend` was left on);
- a CronJob is **not succeeding** once `alert-after-missed` ticks came and went since its
  last successful run (`status.lastSuccessfulTime`, else since it was created) while its
  lock was not frozen: one `NotSucceeding` Warning per episode (every run fails, its image
  cannot be pulled, its pods are refused, or no run starts at all).

The judge is pure: the runtime passes what it remembers (the ticks judged so far and the
scheduled times of the Jobs it saw) and executes the actions; `check_at` says when the
next tick is due to be judged.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from typing import Any, Final

from cronlock_operator.cronjob.defaults import Defaults
from cronlock_operator.cronjob.reading import Readings, read_config
from cronlock_operator.reconcile.actions import Action, CountMissed, PostEvent, SetRunTimes
from cronlock_sidecar import contract
from cronlock_sidecar.lock import schedule
from cronlock_sidecar.microtime import read_time

# The CronJob controller's annotation on the Jobs it creates: the tick the Job is for.
SCHEDULED_TIMESTAMP: Final = "batch.kubernetes.io/cronjob-scheduled-timestamp"
# Ticks judged in one go at most (a CronJob whose controller was away for days): the
# Event then says "at least".
MAX_TICKS: Final = 1000
# How far back a CronJob seen for the first time is judged: one day.
LOOKBACK: Final = datetime.timedelta(days=1)
MISSED: Final = "Missed"
NOT_SUCCEEDING: Final = "NotSucceeding"


@dataclass(frozen=True)
class TickJudgment:
    actions: list[Action]
    # Ticks up to here are judged: the next judgment starts after it.
    judged_through: datetime.datetime
    # When the next tick is due to be judged (None: never, e.g. a schedule that never ticks).
    check_at: datetime.datetime | None
    # The Warnings posted (reason -> message; None: its episode ended), as `posted` keeps.
    posted: dict[str, str | None] = field(default_factory=dict)


def scheduled_tick(job: Mapping[str, Any]) -> datetime.datetime | None:
    """The tick a Job was created for, as the CronJob controller annotated it."""
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    return read_time(annotations.get(SCHEDULED_TIMESTAMP))


def judge(
    cronjob: Mapping[str, Any],
    settings: Defaults,
    now: datetime.datetime,
    *,
    judged_through: datetime.datetime | None,
    started: Set[datetime.datetime],
    frozen: bool,
    posted: Mapping[str, str],
    readings: Readings,
) -> TickJudgment | None:
    """Judge the CronJob's ticks up to `now` minus its deadline; None when its schedule
    cannot be read here (the CronJob controller refuses such a CronJob too).

    `judged_through`: the latest tick judged before (None for a CronJob seen first);
    `started`: the ticks of the Jobs seen since then; `posted`: the last message of each
    Warning reason posted on this CronJob.
    """
    metadata = cronjob["metadata"]
    spec = cronjob.get("spec") or {}
    status = cronjob.get("status") or {}
    namespace, name = str(metadata["namespace"]), str(metadata["name"])
    text, zone, anchor = _schedule_of(cronjob, now)
    last_schedule = read_time(status.get("lastScheduleTime"))
    last_success = read_time(status.get("lastSuccessfulTime"))
    deadline = deadline_of(cronjob, settings)
    if judged_through is None:
        judged_through = max(last_schedule or _created(cronjob, now), now - LOOKBACK)
    due = now - deadline
    ticks: list[datetime.datetime] = []
    if due > judged_through:
        found = schedule.ticks_between(text, zone, judged_through, due, MAX_TICKS, anchor)
        if found is None:
            return None
        ticks = found
    next_run = schedule.next_tick(text, zone, now, anchor)
    missed = [tick for tick in ticks if tick not in started and tick != last_schedule]
    actions: list[Action] = []
    updates: dict[str, str | None] = {}
    if missed:
        actions.append(CountMissed(namespace, name, len(missed)))
        message = _missed_message(cronjob, missed, deadline, spec)
        if posted.get(MISSED) != message:
            actions.append(PostEvent(cronjob, MISSED, message, warning=True))
            updates[MISSED] = message
    elif ticks:
        updates[MISSED] = None  # a tick started its run: a later suspension warns anew
    through = ticks[-1] if len(ticks) == MAX_TICKS else max(judged_through, due)
    failing = not_succeeding(cronjob, settings, now, readings)
    if failing is not None and not frozen:
        if posted.get(NOT_SUCCEEDING) != failing:
            actions.append(PostEvent(cronjob, NOT_SUCCEEDING, failing, warning=True))
            updates[NOT_SUCCEEDING] = failing
    elif posted.get(NOT_SUCCEEDING) is not None:
        updates[NOT_SUCCEEDING] = None
    actions.append(
        SetRunTimes(
            namespace,
            name,
            next_run=next_run.timestamp() if next_run else None,
            last_success=last_success.timestamp() if last_success else None,
            not_succeeding=failing is not None and not frozen,
        )
    )
    check_at = None
    if len(ticks) == MAX_TICKS:
        check_at = now  # more to judge at once
    else:
        upcoming = schedule.next_tick(text, zone, through, anchor)
        if upcoming is not None:
            check_at = upcoming + deadline
    return TickJudgment(actions, through, check_at, updates)


def deadline_of(cronjob: Mapping[str, Any], settings: Defaults) -> datetime.timedelta:
    """How long after its tick a run may start: startingDeadlineSeconds (and a second),
    else the operator's tolerance."""
    starting = (cronjob.get("spec") or {}).get("startingDeadlineSeconds")
    if isinstance(starting, int) and not isinstance(starting, bool):
        return datetime.timedelta(seconds=max(starting, 0) + 1)
    return datetime.timedelta(seconds=settings.missed_tolerance_seconds)


def next_run(cronjob: Mapping[str, Any], now: datetime.datetime) -> datetime.datetime | None:
    """The CronJob's next tick after `now` (None: never, or its schedule unreadable here)."""
    text, zone, anchor = _schedule_of(cronjob, now)
    return schedule.next_tick(text, zone, now, anchor)


def _created(cronjob: Mapping[str, Any], now: datetime.datetime) -> datetime.datetime:
    return read_time((cronjob.get("metadata") or {}).get("creationTimestamp")) or now


def _schedule_of(
    cronjob: Mapping[str, Any], now: datetime.datetime
) -> tuple[str, str | None, datetime.datetime]:
    """Its schedule, time zone, and the anchor of an `@every` schedule (the controller's:
    the last scheduled time, else the creation)."""
    spec = cronjob.get("spec") or {}
    status = cronjob.get("status") or {}
    zone = spec.get("timeZone")
    anchor = read_time(status.get("lastScheduleTime")) or _created(cronjob, now)
    return str(spec.get("schedule") or ""), str(zone) if zone else None, anchor


def _at(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _missed_message(
    cronjob: Mapping[str, Any],
    missed: list[datetime.datetime],
    deadline: datetime.timedelta,
    spec: Mapping[str, Any],
) -> str:
    name = cronjob["metadata"]["name"]
    namespace = cronjob["metadata"]["namespace"]
    if spec.get("suspend") is True:
        # One message for as long as it stays suspended: one Warning, not one per tick.
        return (
            "no run starts: spec.suspend is true; resume with: kubectl patch cronjob -n "
            f'{namespace} {name} -p \'{{"spec":{{"suspend":false}}}}\''
        )
    count = f"at least {len(missed)}" if len(missed) == MAX_TICKS else str(len(missed))
    when = (
        f"the tick at {_at(missed[0])}"
        if len(missed) == 1
        else f"{count} ticks from {_at(missed[0])} to {_at(missed[-1])}"
    )
    seconds = int(deadline.total_seconds())
    return (
        f"no run started for {when} within {seconds}s of its tick (the CronJob controller "
        "may have been down or slow past startingDeadlineSeconds, or the Job was refused: "
        f"kubectl get events -n {namespace} --field-selector involvedObject.name={name})"
    )


def not_succeeding(
    cronjob: Mapping[str, Any],
    settings: Defaults,
    now: datetime.datetime,
    readings: Readings,
) -> str | None:
    """The NotSucceeding message when `alert-after-missed` ticks, each past its deadline,
    came since the last success (else since the CronJob was created); None otherwise, or
    when it is off (0)."""
    reading = read_config(cronjob, settings, readings)
    threshold = reading.alert_after_missed
    status = cronjob.get("status") or {}
    created = _created(cronjob, now)
    since = max(read_time(status.get("lastSuccessfulTime")) or created, created)
    until = now - deadline_of(cronjob, settings)
    if threshold == 0 or until <= since:
        return None
    text, zone, anchor = _schedule_of(cronjob, now)
    ticks = schedule.ticks_between(text, zone, since, until, threshold, anchor) or []
    if len(ticks) < threshold:
        return None
    last = status.get("lastSuccessfulTime")
    namespace = cronjob["metadata"]["namespace"]
    lock = reading.lock
    return (
        f"no run succeeded for {threshold} ticks of the schedule {text!r} (last success: "
        f"{last or 'never'}); its runs: kubectl get jobs -n {namespace} -l "
        f"{contract.LABEL_LOCK}={lock} (cronlock.io/alert-after-missed sets how many ticks)"
    )
