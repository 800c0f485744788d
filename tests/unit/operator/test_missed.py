"""The missed-runs judge (reconcile/missed.py) and its runtime (runtime/ticks.py)."""

from __future__ import annotations

import datetime
from typing import Any

from cronlock_operator.cronjob.reading import Readings
from cronlock_operator.kube.cache import ObjectCache
from cronlock_operator.reconcile import missed
from cronlock_operator.reconcile.actions import CountMissed, PostEvent, SetRunTimes
from cronlock_operator.reconcile.keys import MissedKey
from cronlock_operator.runtime import metrics
from cronlock_operator.runtime.executor import Executor
from cronlock_operator.runtime.ticks import TickWatch
from cronlock_operator.settings import OperatorSettings
from tests.support import gen

SETTINGS = OperatorSettings(sidecar_image="cronlock:test")
UTC = datetime.UTC


def at(minute: int, second: int = 0) -> datetime.datetime:
    return datetime.datetime(2026, 12, 3, 10, minute, second, tzinfo=UTC)


def stamp(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# Every minute, created at 10:00:30, not yet run.
EVERY_MINUTE = (
    gen.with_schedule("* * * * *"),
    gen.with_uid("uid-1"),
    gen.with_metadata(creationTimestamp=stamp(at(0, 30))),
    gen.with_status({}),
)


def judge(body: dict[str, Any], now: datetime.datetime, **kwargs: Any) -> missed.TickJudgment:
    arguments: dict[str, Any] = {
        "judged_through": None,
        "started": frozenset(),
        "frozen": False,
        "posted": {},
        "readings": Readings(),
        **kwargs,
    }
    judgment = missed.judge(body, SETTINGS, now, **arguments)
    assert judgment is not None
    return judgment


def events(judgment: missed.TickJudgment) -> list[PostEvent]:
    return [action for action in judgment.actions if isinstance(action, PostEvent)]


def test_every_tick_that_started_a_run_is_no_miss() -> None:
    judgment = judge(gen.cronjob("report", *EVERY_MINUTE), at(3, 30), started={at(1), at(2)})

    assert events(judgment) == []
    assert not [a for a in judgment.actions if isinstance(a, CountMissed)]
    # The 10:03 tick is judged at 10:04, a minute (the tolerance) after it.
    assert judgment.judged_through == at(2, 30)
    assert judgment.check_at == at(4)
    times = [a for a in judgment.actions if isinstance(a, SetRunTimes)]
    assert times == [SetRunTimes("team-a", "report", at(4).timestamp(), None, False)]


def test_ticks_without_a_run_are_missed_in_one_warning() -> None:
    judgment = judge(gen.cronjob("report", *EVERY_MINUTE), at(3, 30))

    assert CountMissed("team-a", "report", 2) in judgment.actions
    (event,) = events(judgment)
    assert event.reason == "Missed"
    assert event.warning
    assert "2 ticks from 2026-12-03T10:01:00Z to 2026-12-03T10:02:00Z within 60s" in event.message
    assert judgment.posted == {"Missed": event.message}


def test_the_last_schedule_time_started_a_run_even_when_its_job_is_gone() -> None:
    body = gen.cronjob("report", *EVERY_MINUTE, gen.with_status({"lastScheduleTime": stamp(at(2))}))

    judgment = judge(body, at(3, 30), judged_through=at(0, 30))

    assert CountMissed("team-a", "report", 1) in judgment.actions
    assert "the tick at 2026-12-03T10:01:00Z" in events(judgment)[0].message


def test_a_cronjob_seen_first_is_judged_from_its_last_schedule() -> None:
    body = gen.cronjob("report", *EVERY_MINUTE, gen.with_status({"lastScheduleTime": stamp(at(2))}))

    judgment = judge(body, at(3, 30))

    assert events(judgment) == []
    assert judgment.judged_through == at(2, 30)


def test_starting_deadline_seconds_is_the_deadline() -> None:
    body = gen.cronjob("report", *EVERY_MINUTE, gen.with_spec(startingDeadlineSeconds=15))

    judgment = judge(body, at(1, 20))

    assert CountMissed("team-a", "report", 1) in judgment.actions
    assert "within 16s" in events(judgment)[0].message
    assert judgment.check_at == at(2, 16)


def test_a_suspended_cronjob_warns_once_while_it_stays_suspended() -> None:
    body = gen.cronjob("report", *EVERY_MINUTE, gen.with_spec(suspend=True))

    first = judge(body, at(3, 30))
    (event,) = events(first)
    assert "spec.suspend is true" in event.message
    assert "kubectl patch cronjob -n team-a report" in event.message
    later = judge(body, at(4, 30), judged_through=first.judged_through, posted=first.posted)

    assert [event for event in events(later) if event.reason == "Missed"] == []
    assert CountMissed("team-a", "report", 1) in later.actions
    # Three ticks and no success: it is not succeeding either.
    assert [event.reason for event in events(later)] == ["NotSucceeding"]


def test_a_run_after_misses_ends_the_episode() -> None:
    first = judge(gen.cronjob("report", *EVERY_MINUTE), at(3, 30))

    later = judge(
        gen.cronjob("report", *EVERY_MINUTE),
        at(4, 30),
        judged_through=first.judged_through,
        started={at(3)},
        posted=first.posted,
    )

    assert [event for event in events(later) if event.reason == "Missed"] == []
    assert later.posted["Missed"] is None


def test_not_succeeding_after_alert_after_missed_ticks() -> None:
    body = gen.cronjob(
        "report", *EVERY_MINUTE, gen.annotated({"cronlock.io/alert-after-missed": "2"})
    )

    judgment = judge(body, at(3, 30), started={at(1), at(2)})

    (event,) = events(judgment)
    assert event.reason == "NotSucceeding"
    assert event.warning
    assert "no run succeeded for 2 ticks" in event.message
    assert "last success: never" in event.message
    assert "kubectl get jobs -n team-a -l cronlock.io/lock=report" in event.message
    assert next(a for a in judgment.actions if isinstance(a, SetRunTimes)).not_succeeding
    again = judge(
        body,
        at(4, 30),
        judged_through=judgment.judged_through,
        started={at(3)},
        posted=judgment.posted,
    )
    assert events(again) == []


def test_a_success_or_a_freeze_or_zero_means_no_not_succeeding() -> None:
    failing = {"cronlock.io/alert-after-missed": "2"}
    succeeded = gen.cronjob(
        "report",
        *EVERY_MINUTE,
        gen.annotated(failing),
        gen.with_status({"lastSuccessfulTime": stamp(at(2, 10))}),
    )
    assert events(judge(succeeded, at(3, 30), started={at(1), at(2)})) == []
    assert (
        events(
            judge(
                gen.cronjob("report", *EVERY_MINUTE, gen.annotated(failing)),
                at(3, 30),
                frozen=True,
                started={at(1), at(2)},
            )
        )
        == []
    )
    off = gen.cronjob(
        "report", *EVERY_MINUTE, gen.annotated({"cronlock.io/alert-after-missed": "0"})
    )
    assert events(judge(off, at(9, 30), started={at(m) for m in range(1, 9)})) == []
    recovered = judge(
        succeeded, at(3, 30), started={at(1), at(2)}, posted={"NotSucceeding": "earlier"}
    )
    assert recovered.posted.get("NotSucceeding", "kept") is None


def test_a_long_outage_is_judged_in_slices() -> None:
    body = gen.cronjob("report", *EVERY_MINUTE)
    body["metadata"]["creationTimestamp"] = "2026-11-01T00:00:00Z"

    judgment = judge(body, at(0))

    assert CountMissed("team-a", "report", missed.MAX_TICKS) in judgment.actions
    assert "at least 1000 ticks" in events(judgment)[0].message
    assert judgment.check_at == at(0)  # the rest at once


def test_a_schedule_not_understood_is_none() -> None:
    assert (
        missed.judge(
            gen.cronjob("report", *EVERY_MINUTE, gen.with_schedule("61 * * * *")),
            SETTINGS,
            at(3, 30),
            judged_through=None,
            started=frozenset(),
            frozen=False,
            posted={},
            readings=Readings(),
        )
        is None
    )


def test_next_run_and_not_succeeding_for_status() -> None:
    body = gen.cronjob("report", *EVERY_MINUTE, gen.with_schedule("*/5 * * * *"))
    assert missed.next_run(body, at(3, 30)) == at(5)
    assert missed.not_succeeding(body, SETTINGS, at(3, 30), Readings()) is None


# --- the runtime ---------------------------------------------------------------------


class Clock:
    def __init__(self, now: datetime.datetime) -> None:
        self.now = now

    def __call__(self) -> datetime.datetime:
        return self.now


def watch(clock: Clock, posted: list[tuple[str, str]]) -> tuple[TickWatch, ObjectCache]:
    cronjobs = ObjectCache()
    executor = Executor(
        kube=None,  # type: ignore[arg-type]  # these actions make no API call
        cronjob_written=lambda body: None,
        lease_written=lambda body: None,
        post_event=lambda body, reason, message, warning: posted.append((reason, message)),
    )
    return TickWatch(
        SETTINGS, executor, cronjobs, lambda ns, lock: False, now=clock, readings=Readings()
    ), cronjobs


def test_tick_watch_judges_when_due_and_remembers_the_jobs_it_saw() -> None:
    clock = Clock(at(0, 40))
    posted: list[tuple[str, str]] = []
    ticks, cronjobs = watch(clock, posted)
    body = gen.cronjob("report", *EVERY_MINUTE)
    cronjobs.put(body)

    ticks.cronjob_seen(("team-a", "report"), body)
    assert ticks.due() == [("team-a", "report")]
    ticks.judge(MissedKey("team-a", "report"))
    assert ticks.due() == []  # next: the 10:01 tick, at 10:02
    clock.now = at(1, 5)
    job = {
        "metadata": {
            "name": "report-29412601",
            "namespace": "team-a",
            "annotations": {missed.SCHEDULED_TIMESTAMP: stamp(at(1))},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "CronJob", "name": "report", "controller": True}
            ],
        }
    }
    ticks.job_seen(job)
    clock.now = at(2, 0)
    assert ticks.due() == [("team-a", "report")]
    ticks.judge(MissedKey("team-a", "report"))
    assert posted == []
    clock.now = at(3, 0)
    assert ticks.due() == [("team-a", "report")]
    ticks.judge(MissedKey("team-a", "report"))
    assert [reason for reason, _ in posted] == ["Missed"]
    assert "the tick at 2026-12-03T10:02:00Z" in posted[0][1]
    sample = metrics.registry.get_sample_value(
        "cronlock_missed_runs_total", {"namespace": "team-a", "cronjob": "report"}
    )
    assert sample is not None
    assert sample >= 1


def test_tick_watch_forgets_a_cronjob_no_longer_guarded() -> None:
    clock = Clock(at(0, 40))
    ticks, cronjobs = watch(clock, [])
    body = gen.cronjob("report", *EVERY_MINUTE, gen.annotated({"cronlock.io/enabled": "false"}))
    cronjobs.put(body)

    ticks.cronjob_seen(("team-a", "report"), body)

    assert ticks.due() == []
