"""The tick model: a Job's tick, the lock's record, and when a run already ran."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cronlock_sidecar.lock import ticks

NOON = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
MINUTES = int(NOON.timestamp()) // 60


def test_a_scheduled_jobs_name_gives_its_tick() -> None:
    assert ticks.tick_of_job("nightly", f"nightly-{MINUTES}") == NOON
    # a CronJob whose name is another's prefix: only its own Jobs' names give a tick
    assert ticks.tick_of_job("nightly", f"nightly-x-{MINUTES}") is None
    assert ticks.tick_of_job("nightly", "nightly-manual") is None
    assert ticks.tick_of_job("nightly", f"nightly-{MINUTES}-retry") is None
    assert ticks.tick_of_job("", f"nightly-{MINUTES}") is None
    assert ticks.tick_of_job("nightly", "nightly-" + "9" * 12) is None


def test_a_record_reads_back_as_written_and_nothing_else_reads() -> None:
    record = ticks.TickRecord("nightly", NOON, f"nightly-{MINUTES}", "uid-1", "pod_1234", "")
    annotations = ticks.with_record({"other": "x"}, record)
    assert annotations["cronlock.io/tick.nightly"] == (
        f"2026-12-06T12:00:00Z nightly-{MINUTES} uid-1 pod_1234 -"
    )
    assert ticks.read_record(annotations, "nightly") == record
    assert ticks.records(annotations) == [record]
    for hostile in (
        "",
        "2026-12-06T12:00:00Z a b c",
        "2026-12-06T12:00:00Z a b c d e",
        "2026-12-06T12:00:00.5Z a b c d",
        "2026-13-06T12:00:00Z a b c d",
        "2026-12-06T12:00:00Z a  c d",
        "2026-12-06T12:00:00Z a b\u00e9 c d",
    ):
        assert ticks.read_record({"cronlock.io/tick.nightly": hostile}, "nightly") is None


def test_a_tick_claimed_by_another_run_already_ran_and_the_same_run_goes_on() -> None:
    mine = ticks.Tick("nightly", NOON, f"nightly-{MINUTES}", "uid-b")
    by_a = ticks.TickRecord("nightly", NOON, f"nightly-{MINUTES}", "uid-a", "pod-a_1", "a")
    now = NOON + timedelta(seconds=3)
    assert ticks.already_ran(mine, by_a, now, 2.0) == by_a
    # an older tick, late: a newer one was worked, so this one is never worked after it
    assert ticks.already_ran(mine._replace(at=NOON - timedelta(minutes=1)), by_a, now, 2.0)
    # the same run (a retry pod of the same Job) goes on
    assert ticks.already_ran(mine._replace(run="uid-a"), by_a, now, 2.0) is None
    # a newer tick goes on; a manual run (no tick) keeps today's rules
    assert ticks.already_ran(mine._replace(at=NOON + timedelta(minutes=1)), by_a, now, 2) is None
    assert ticks.already_ran(None, by_a, now, 2.0) is None


def test_a_tick_ahead_of_the_clock_is_nobodys_and_silences_nothing() -> None:
    mine = ticks.Tick("nightly", NOON, f"nightly-{MINUTES}", "uid-b")
    future = ticks.TickRecord("nightly", NOON + timedelta(days=365), "x", "evil", "pod_1", "")
    assert ticks.already_ran(mine, future, NOON, 2.0) is None
    within_skew = future._replace(at=NOON + timedelta(seconds=2))
    assert ticks.already_ran(mine, within_skew, NOON, 2.0) == within_skew


def test_names_that_can_have_ticks() -> None:
    assert ticks.valid_name("nightly")
    assert ticks.valid_name("a" * 52)
    assert not ticks.valid_name("a" * 53)
    assert not ticks.valid_name("Nightly")
    assert not ticks.valid_name("")
    assert not ticks.valid_name("-x")


def test_the_skip_line_says_already_ran() -> None:
    mine = ticks.Tick("nightly", NOON, "nightly-1", "uid-b")
    by_a = ticks.TickRecord("nightly", NOON, "nightly-1", "uid-a", "pod-a_1", "east")
    line = ticks.skip_line(mine, by_a, "default/cronlock-nightly")
    assert line.startswith("already ran: tick 2026-12-06T12:00:00Z of nightly")
    assert "cluster east" in line
