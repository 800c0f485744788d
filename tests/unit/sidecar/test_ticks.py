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


def test_the_success_record_is_its_own_key_and_reads_as_a_claim_does() -> None:
    claim = ticks.TickRecord("nightly", NOON, f"nightly-{MINUTES}", "uid-1", "pod_1234", "")
    annotations = ticks.with_record({}, claim, "cronlock.io/succeeded.")
    assert annotations == {"cronlock.io/succeeded.nightly": claim.text()}
    assert ticks.read_success(annotations, "nightly") == claim
    # a claim record is no success record, nor the other way round
    assert ticks.read_record(annotations, "nightly") is None
    assert ticks.read_success(ticks.with_record({}, claim), "nightly") is None
    assert ticks.records(annotations) == []
    assert ticks.records(annotations, "cronlock.io/succeeded.") == [claim]


def test_a_success_is_recorded_only_for_the_claim_of_that_run_and_tick() -> None:
    claim = ticks.TickRecord("nightly", NOON, f"nightly-{MINUTES}", "uid-1", "pod_1234", "c")
    on_lock = ticks.with_record({}, claim)
    now = NOON + timedelta(seconds=30)
    assert ticks.success_of(on_lock, "nightly", NOON, "uid-1", now, 2.0) == claim
    # another run of the tick, another tick, another CronJob: nothing to record
    assert ticks.success_of(on_lock, "nightly", NOON, "uid-2", now, 2.0) is None
    assert (
        ticks.success_of(on_lock, "nightly", NOON - timedelta(minutes=1), "uid-1", now, 2) is None
    )
    assert ticks.success_of(on_lock, "weekly", NOON, "uid-1", now, 2.0) is None
    # a later claim came before the success was counted: its run's success is not this one's
    later = claim._replace(at=NOON + timedelta(minutes=1), run="uid-2")
    assert ticks.success_of(ticks.with_record({}, later), "nightly", NOON, "uid-1", now, 2) is None
    # the success of that tick, or a newer one, is recorded already: nothing moves back
    done = ticks.with_record(on_lock, claim, "cronlock.io/succeeded.")
    assert ticks.success_of(done, "nightly", NOON, "uid-1", now, 2.0) is None
    older = claim._replace(at=NOON - timedelta(minutes=1), run="uid-0")
    moved = ticks.with_record(on_lock, older, "cronlock.io/succeeded.")
    assert ticks.success_of(moved, "nightly", NOON, "uid-1", now, 2.0) == claim
    # a far-future success record (nobody's) blocks nothing; a far-future claim is none
    future = claim._replace(at=NOON + timedelta(days=365))
    ahead = ticks.with_record(on_lock, future, "cronlock.io/succeeded.")
    assert ticks.success_of(ahead, "nightly", NOON, "uid-1", now, 2.0) == claim
    far = ticks.with_record({}, future)
    assert ticks.success_of(far, "nightly", future.at, "uid-1", now, 2.0) is None


def test_a_manual_run_numbered_like_people_number_them_is_no_tick() -> None:
    """`kubectl create job --from=cronjob/nightly nightly-1` was read as the tick of
    1970-01-01T00:01Z, and a run of it skipped as "already ran" after any later claim
    (test_shared_lock's export-a-0, after export-a-2 had claimed "00:02")."""
    assert ticks.tick_of_job("nightly", "nightly-0") is None
    assert ticks.tick_of_job("nightly", "nightly-1") is None
    assert ticks.tick_of_job("nightly", "nightly-20240101") is None  # a date, not minutes
    assert ticks.tick_of_job("nightly", "nightly-26297279") is None  # 2019-12-31T23:59Z
    assert ticks.tick_of_job("nightly", "nightly-26297280") == ticks.FIRST_TICK
