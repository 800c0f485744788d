"""The tick mode's counting (tests/reliability/tick_counts.py), on the events and lines the
contenders leave: a tick worked by two runs is counted, and so is each way a tick is never
worked."""

from __future__ import annotations

from tests.reliability.tick_counts import count_ticks, skips_in

T1, T2, T3, T4 = (f"2026-12-06T12:00:0{second}Z" for second in (1, 3, 5, 7))
# ticks.skip_line as `run` logs it, after the log's own prefix.
LOG = (
    "2026-12-06 12:00:02,100 cronlock-sidecar INFO already ran: tick "
    f"{T1} of reliability on lock ns/lock-0 was claimed by a run (run r1, holder h1) for "
    f"tick {T1}; skipping this run\n"
    "2026-12-06 12:00:09,000 cronlock-sidecar INFO already ran: tick "
    f"{T3} of reliability on lock ns/lock-0 was claimed by a run (run r9, holder h9, "
    f"cluster b) for tick {T4}; skipping this run\n"
    "2026-12-06 12:00:09,500 cronlock-sidecar INFO lease ns/lock-0 acquired by h9\n"
)


def test_the_skip_lines_give_the_tick_and_the_tick_the_lock_recorded() -> None:
    assert skips_in(LOG) == [(T1, T1), (T3, T4)]


def test_a_tick_worked_once_and_its_other_run_skipped_is_no_defect() -> None:
    counts = count_ticks([T1], [(T1, 101)], [(T1, 0), (T1, 75)], [(T1, T1)])
    assert (counts.worked, counts.worked_twice, counts.never_worked) == (1, 0, 0)
    assert counts.skipped_already_ran == 1
    assert counts.examples == []


def test_a_tick_two_runs_started_is_worked_twice() -> None:
    # What the checker sees while `run` does not skip `already ran`: both contenders work.
    counts = count_ticks([T1, T2], [(T1, 101), (T1, 102), (T2, 103), (T2, 103)], [], [])
    assert (counts.ticks, counts.worked, counts.worked_twice) == (2, 2, 1)
    assert counts.examples == [f"{T1} worked by 2 runs"]


def test_why_a_tick_was_never_worked() -> None:
    counts = count_ticks(
        [T1, T2, T3, T4],
        [(T4, 104)],
        # T1: every contender could not reach the lock; T2: one waited and gave up (75
        # without `already ran`) while the lock was reachable; T3: a later tick claimed first.
        [(T1, 69), (T1, 69), (T2, 69), (T2, 75), (T3, 75), (T3, 75), (T4, 0)],
        [(T3, T4)],
    )
    assert counts.never_worked == 3
    assert counts.lost_in_outage == 1
    assert counts.lost_while_healthy == 1
    assert counts.superseded == 1
    assert counts.examples == [f"{T2} never worked, contenders exited [69, 75]"]


def test_a_skip_naming_the_same_tick_with_no_work_of_it_is_a_tick_lost() -> None:
    # The lock says the tick was claimed, yet no work unit of it started (a claim whose
    # work never began): not superseded, lost.
    counts = count_ticks([T1], [], [(T1, 75)], [(T1, T1)])
    assert (counts.superseded, counts.lost_while_healthy) == (0, 1)
