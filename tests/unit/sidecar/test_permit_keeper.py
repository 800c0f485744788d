"""The keeper and the policies on a lock of N permits (lock/permits.py), over a fake
clock and a fake transport: one permit per run, the lowest free one, each tick once."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest

from cronlock_sidecar.cli import main
from cronlock_sidecar.contract import ANNOTATION_PERMITS, ANNOTATION_YIELD_TO, EXIT_CONFIG
from cronlock_sidecar.holding import lease as lease_module
from cronlock_sidecar.holding.lease import (
    Acquired,
    Busy,
    LeaseKeeper,
    PermitsDisagree,
    RenewOutcome,
)
from cronlock_sidecar.holding.policy import acquire
from cronlock_sidecar.lock import permits
from cronlock_sidecar.lock.model import Timing, noted, read_lease
from cronlock_sidecar.lock.ticks import Tick, read_record
from cronlock_sidecar.options import ConfigError, parse_options
from cronlock_sidecar.pod.rundir import tick_env
from cronlock_sidecar.transport.seam import Conflict, Unavailable
from tests.support.leases import make_lease
from tests.unit.sidecar.fakes import LEASE, START, FakeClock, FakeTransport

TIMING = Timing.of(60, 20, 2)
A, B, C = "pod-a_11111111", "pod-b_22222222", "pod-c_33333333"
TICK_AT = START.replace(second=0, microsecond=0)


def keeper(transport: FakeTransport, clock: FakeClock, identity: str, **kwargs: Any) -> LeaseKeeper:
    job_name = kwargs.pop("job_name", "")
    return LeaseKeeper(transport, LEASE, identity, TIMING, clock, job_name, **kwargs)


def lock(count: int, holder: str = "", **kwargs: Any) -> dict[str, Any]:
    """A lock of `count` permits; permit 0 held by `holder`; `entries` K → entry text."""
    entries: dict[int, permits.Permit] = kwargs.pop("entries", {})
    annotations = {ANNOTATION_PERMITS: str(count), **kwargs.pop("annotations", {})}
    annotations.update({permits.permit_key(k): entry.text() for k, entry in entries.items()})
    return make_lease(holder, annotations=annotations, **kwargs)


def entry(
    number: int, holder: str, *, renewed_ago: float = 1, transitions: int = 1, job: str = ""
) -> permits.Permit:
    at = START - timedelta(seconds=renewed_ago)
    return permits.Permit(number, holder, at, at, 60, transitions, job)


def stored(transport: FakeTransport) -> tuple[permits.Permit, ...]:
    assert transport.lease is not None
    return permits.read_permits(transport.lease)


def test_a_claim_takes_the_lowest_free_permit_and_leaves_the_others_as_they_were(
    transport: FakeTransport, clock: FakeClock
) -> None:
    transport.store(lock(3, A, entries={2: entry(2, C, transitions=4)}))
    result = keeper(transport, clock, B).try_acquire()
    assert isinstance(result, Acquired)
    assert (result.permit, result.transitions) == (1, 1)
    first, second, third = stored(transport)
    assert (first.holder, first.transitions) == (A, 1)  # permit 0: the spec, untouched
    assert (second.holder, second.acquire_time, second.duration_seconds) == (B, START, 60)
    assert (third.holder, third.transitions) == (C, 4)


def test_a_free_spec_is_permit_0_and_taken_first(
    transport: FakeTransport, clock: FakeClock
) -> None:
    transport.store(lock(2, entries={1: entry(1, A)}))
    result = keeper(transport, clock, B).try_acquire()
    assert isinstance(result, Acquired)
    assert result.permit == 0
    assert [permit.holder for permit in stored(transport)] == [B, A]


def test_all_permits_held_is_busy_with_the_lock_n_and_every_holder(
    transport: FakeTransport, clock: FakeClock
) -> None:
    transport.store(lock(2, A, entries={1: entry(1, C, renewed_ago=50)}))
    result = keeper(transport, clock, B).try_acquire()
    assert isinstance(result, Busy)
    assert result.message() == (
        "all 2 permits of lock default/cronlock-report are held: pod-a_11111111 (permit 0), "
        "pod-c_33333333 (permit 1); skipping this run"
    )
    # The hold that ends first is the one a waiting run is told of.
    assert result.holder == C
    assert round(result.expires_in) == 10
    assert transport.writes() == []


def test_an_expired_permit_is_taken_with_one_more_transition(
    transport: FakeTransport, clock: FakeClock
) -> None:
    transport.store(lock(2, A, entries={1: entry(1, C, renewed_ago=200, transitions=6)}))
    result = keeper(transport, clock, B).try_acquire()
    assert isinstance(result, Acquired)
    assert (result.permit, result.transitions, result.reason) == (1, 7, "expired")


def test_a_retry_pod_takes_its_own_jobs_permit_at_once_not_a_second_one(
    transport: FakeTransport, clock: FakeClock
) -> None:
    # Permit 0 is free, but the Job's earlier pod holds permit 1: the retry takes that one.
    transport.store(lock(2, entries={1: entry(1, A, job="report-29001", transitions=3)}))
    result = keeper(transport, clock, B, job_name="report-29001").try_acquire()
    assert isinstance(result, Acquired)
    assert (result.permit, result.transitions) == (1, 4)
    assert [permit.holder for permit in stored(transport)] == ["", B]


def test_two_runs_of_one_tick_racing_for_two_free_permits_one_skips(
    transport: FakeTransport, clock: FakeClock
) -> None:
    transport.store(lock(2))
    tick = Tick("report", TICK_AT, "report-1", "uid-first")
    retry = Tick("report", TICK_AT, "report-1", "uid-second")
    first = keeper(transport, clock, A, tick=tick)
    second = keeper(transport, clock, B, tick=retry)
    outcomes: list[Acquired | Busy] = []
    # The second run writes between the first run's read and its write.
    transport.before_write.append(lambda _: outcomes.append(second.try_acquire()))
    outcomes.append(first.try_acquire())
    won, lost = outcomes
    assert isinstance(won, Acquired)
    assert won.holder == B
    assert isinstance(lost, Busy)
    assert lost.already_ran
    assert lost.message().startswith("already ran: tick ")
    assert "claimed by " in lost.message()
    assert [permit.holder for permit in stored(transport)] == [B, ""]
    assert transport.lease is not None
    record = read_record(transport.lease["metadata"]["annotations"], "report")
    assert record is not None
    assert record.run == "uid-second"


def test_a_tick_claimed_by_a_holder_of_another_permit_is_not_claimed_again(
    transport: FakeTransport, clock: FakeClock
) -> None:
    tick = Tick("report", TICK_AT, "report-1", "uid-first")
    transport.store(lock(3))
    assert isinstance(keeper(transport, clock, A, tick=tick).try_acquire(), Acquired)
    again = Tick("report", TICK_AT, "report-1b", "uid-other")
    result = keeper(transport, clock, B, tick=again).try_acquire()
    assert isinstance(result, Busy)
    assert result.already_ran
    assert [permit.holder for permit in stored(transport)] == [A, "", ""]


def test_renew_and_release_write_only_the_holders_own_permit(
    transport: FakeTransport, clock: FakeClock
) -> None:
    transport.store(lock(2, A))
    mine = keeper(transport, clock, B)
    assert isinstance(mine.try_acquire(), Acquired)
    spec_before = transport.lease["spec"] if transport.lease else {}
    clock.advance(20)
    assert mine.renew().outcome is RenewOutcome.RENEWED
    first, second = stored(transport)
    assert transport.lease is not None
    assert transport.lease["spec"] == spec_before
    assert second.renew_time == START + timedelta(seconds=20)
    assert mine.release()
    first, second = stored(transport)
    assert (first.holder, second.holder, second.transitions) == (A, "", 1)
    assert transport.lease["spec"] == spec_before
    assert read_lease(transport.lease).last_holder == B


def test_a_renew_that_meets_another_holders_write_reads_again_and_renews_at_once(
    transport: FakeTransport, clock: FakeClock
) -> None:
    transport.store(lock(3))
    other = keeper(transport, clock, A)
    mine = keeper(transport, clock, B)
    assert isinstance(other.try_acquire(), Acquired)
    assert isinstance(mine.try_acquire(), Acquired)
    clock.advance(5)
    # Two other writes land between our renewals' reads and writes: we retry each at once.
    assert other.renew().outcome is RenewOutcome.RENEWED
    transport.before_write.append(lambda _: other.renew())
    result = mine.renew()
    assert result.outcome is RenewOutcome.RENEWED
    first, second, _ = stored(transport)
    assert (first.holder, second.holder) == (A, B)
    assert second.renew_time == START + timedelta(seconds=5)
    assert mine.valid_until() == clock.monotonic() + TIMING.renew_deadline


def test_a_renew_conflicting_without_end_fails_after_a_bound_instead_of_spinning(
    transport: FakeTransport, clock: FakeClock
) -> None:
    transport.store(lock(2, A))
    mine = keeper(transport, clock, B)
    assert isinstance(mine.try_acquire(), Acquired)

    # Another write before every one of ours, for longer than the bound.
    transport.fail("replace", *(Conflict("update", LEASE, "modified") for _ in range(30)))
    result = mine.renew()
    assert result.outcome is RenewOutcome.FAILED
    assert "write conflicts in a row" in result.detail
    assert mine.held


@pytest.mark.parametrize(("count", "allowed"), [(1, 10), (2, 12), (16, 40)])
def test_a_claim_rides_out_two_conflicts_per_other_holder_and_no_more(
    transport: FakeTransport, clock: FakeClock, count: int, allowed: int
) -> None:
    """16 holders claiming at one tick: one winner per round, so the last meets about 15
    conflicts (docs/PERFORMANCE.md, "Permits": 10 met, and refused, under the flat 10)."""
    assert lease_module.conflicts_allowed(count) == allowed
    transport.store(lock(count))
    transport.fail("replace", *(Conflict("update", LEASE, "modified") for _ in range(allowed - 1)))
    assert isinstance(keeper(transport, clock, B).try_acquire(), Acquired)
    transport.store(lock(count))
    transport.fail("replace", *(Conflict("update", LEASE, "modified") for _ in range(allowed)))
    with pytest.raises(Unavailable, match=f"{allowed} write conflicts in a row"):
        keeper(transport, clock, C).try_acquire()


def test_a_holder_whose_permit_was_taken_has_lost(
    transport: FakeTransport, clock: FakeClock
) -> None:
    transport.store(lock(2, A))
    mine = keeper(transport, clock, B)
    assert isinstance(mine.try_acquire(), Acquired)
    assert transport.lease is not None
    taken = permits.claimed_permit(transport.lease, 1, C, TIMING, clock.now(), "")
    transport.store(taken)
    result = mine.renew()
    assert result.outcome is RenewOutcome.LOST
    assert result.detail == f"now held by {C}"
    assert not mine.release()  # never writes over the new holder's permit
    assert stored(transport)[1].holder == C


def test_a_restarted_sidecar_resumes_its_own_permit_and_renews_only_that_entry(
    transport: FakeTransport, clock: FakeClock
) -> None:
    transport.store(lock(3, A))
    assert isinstance(keeper(transport, clock, B).try_acquire(), Acquired)
    clock.advance(5)
    restarted = keeper(transport, clock, B)
    result = restarted.resume()
    assert result is not None
    assert (result.permit, result.transitions, result.resumed) == (1, 1, True)
    first, second, third = stored(transport)
    assert (first.holder, second.holder, third.holder) == (A, B, "")
    assert second.renew_time == START + timedelta(seconds=5)
    assert restarted.release()
    assert [permit.holder for permit in stored(transport)] == [A, "", ""]


def test_a_restarted_sidecar_whose_permit_is_gone_does_not_resume(
    transport: FakeTransport, clock: FakeClock
) -> None:
    transport.store(lock(2, A, entries={1: entry(1, C)}))
    restarted = keeper(transport, clock, B)
    assert restarted.resume() is None
    assert restarted.lost
    assert transport.writes() == []


def test_each_permits_fencing_token_only_grows(transport: FakeTransport, clock: FakeClock) -> None:
    transport.store(lock(2, A))
    tokens = []
    for identity in (B, C, B):
        run = keeper(transport, clock, identity)
        result = run.try_acquire()
        assert isinstance(result, Acquired)
        assert result.permit == 1
        tokens.append(result.transitions)
        assert run.release()
        clock.advance(1)
    assert tokens == [1, 2, 3]
    assert stored(transport)[0].transitions == 1  # permit 0's token is its own


def test_a_lock_without_a_permits_value_is_todays_one_holder_lock(
    transport: FakeTransport, clock: FakeClock
) -> None:
    # An entry of permit 1 on a lock that says no N is nobody's permit.
    transport.store(make_lease(A, annotations={permits.permit_key(1): entry(1, "").text()}))
    result = keeper(transport, clock, B).try_acquire()
    assert isinstance(result, Busy)
    assert result.permits == ()
    assert result.message().startswith("already running: lease default/cronlock-report held by")


def test_run_permits_is_written_on_a_lock_that_says_none(
    transport: FakeTransport, clock: FakeClock
) -> None:
    transport.store(make_lease())
    result = keeper(transport, clock, B, permits=2).try_acquire()
    assert isinstance(result, Acquired)
    assert result.permit == 0
    assert transport.lease is not None
    assert transport.lease["metadata"]["annotations"][ANNOTATION_PERMITS] == "2"


def test_run_permits_refuses_a_lock_that_says_none_while_it_is_held(
    transport: FakeTransport, clock: FakeClock
) -> None:
    """A lock that says no N is of one permit: its holder believes it works alone, so a run
    of two permits may not join it (a store's rule 1 refuses that write too)."""
    transport.store(make_lease(A))
    with pytest.raises(PermitsDisagree, match=r"says '1' permits .* requires 2 \(--permits\)"):
        keeper(transport, clock, B, permits=2).try_acquire()
    assert transport.writes() == []


def test_run_permits_is_written_on_the_lease_it_creates(
    transport: FakeTransport, clock: FakeClock
) -> None:
    result = keeper(transport, clock, B, permits=3).try_acquire()
    assert isinstance(result, Acquired)
    assert transport.lease is not None
    assert transport.lease["metadata"]["annotations"][ANNOTATION_PERMITS] == "3"
    assert len(stored(transport)) == 3


@pytest.mark.parametrize("said", ["3", "1", "many"])
def test_run_permits_refuses_a_lock_that_says_another_n(
    transport: FakeTransport, clock: FakeClock, said: str
) -> None:
    transport.store(make_lease(A, annotations={ANNOTATION_PERMITS: said}))
    with pytest.raises(PermitsDisagree, match=r"says '.*' permits .* requires 2 \(--permits\)"):
        keeper(transport, clock, B, permits=2).try_acquire()
    assert transport.writes() == []


@pytest.mark.parametrize("said", ["3", "1", "many"])
def test_run_permits_writes_its_n_over_another_once_no_permit_is_held(
    transport: FakeTransport, clock: FakeClock, said: str
) -> None:
    """The runs of the old N have ended (free, or expired): the first run of the new N
    writes it in its claim (a store's rule 1 allows exactly that, docs/DECISIONS.md)."""
    expired = entry(1, C, renewed_ago=TIMING.lease_duration_seconds + TIMING.skew + 1)
    transport.store(lock(3, "", entries={1: expired}, annotations={ANNOTATION_PERMITS: said}))
    result = keeper(transport, clock, B, permits=2).try_acquire()
    assert isinstance(result, Acquired)
    assert transport.lease is not None
    assert transport.lease["metadata"]["annotations"][ANNOTATION_PERMITS] == "2"


def test_run_permits_refuses_another_n_while_any_permit_of_it_is_held(
    transport: FakeTransport, clock: FakeClock
) -> None:
    transport.store(lock(3, "", entries={2: entry(2, C)}))
    with pytest.raises(PermitsDisagree, match=r"says '3' permits .* requires 2"):
        keeper(transport, clock, B, permits=2).try_acquire()
    assert transport.writes() == []


def test_in_a_store_a_lock_of_two_permits_is_two_permits(
    transport: FakeTransport, clock: FakeClock
) -> None:
    """The stores keep the permit rules themselves (docs/DECISIONS.md, "Permits in a
    store"): a keeper on a store claims a free permit as on a Lease."""
    transport.store(lock(2, A))
    result = keeper(transport, clock, B, caps_holds=True).try_acquire()
    assert isinstance(result, Acquired)
    assert result.permit == 1


def test_policy_replace_asks_no_holder_of_a_full_lock_of_permits_to_yield(
    transport: FakeTransport, clock: FakeClock
) -> None:
    transport.store(lock(2, A, entries={1: entry(1, C)}))
    replacing = keeper(transport, clock, B, yields=True)
    result = acquire(replacing, policy="replace", wait_timeout=30, pause=lambda _: False)
    assert isinstance(result, Busy)
    assert result.why == "replace with permits"
    assert "not supported yet" in result.message()
    assert result.message().startswith("all 2 permits of lock default/cronlock-report are held")
    assert transport.writes() == []


def test_policy_wait_takes_the_first_permit_that_frees(
    transport: FakeTransport, clock: FakeClock
) -> None:
    transport.store(lock(2, A, entries={1: entry(1, C)}))
    holder = keeper(transport, clock, C)
    pauses: list[float] = []

    def pause(seconds: float) -> bool:
        pauses.append(seconds)
        if len(pauses) == 3:
            assert transport.lease is not None
            transport.store(permits.released_permit(transport.lease, 1, C, clock.now()))
        clock.advance(seconds)
        return False

    del holder
    result = acquire(keeper(transport, clock, B), policy="wait", wait_timeout=30, pause=pause)
    assert isinstance(result, Acquired)
    assert (result.permit, result.transitions) == (1, 2)
    assert len(pauses) == 3


def test_the_work_is_told_its_permit_in_tick_env() -> None:
    told = tick_env(None, None, permit=1)
    assert "CRONLOCK_PERMIT=1\n" in told
    assert "CRONLOCK_PERMIT=\n" in tick_env(None, None)


# --- run --permits N: the option ------------------------------------------------------
def test_run_permits_is_read_from_the_flag_or_its_environment_twin() -> None:
    argv = ["run", "--lease", "ns/x", "--", "true"]
    assert parse_options([*argv[:3], "--permits", "16", *argv[3:]], {}).permits == 16
    assert parse_options(argv, {"CRONLOCK_PERMITS": "2"}).permits == 2
    assert parse_options(argv, {}).permits is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--permits", "0"], "--permits: '0' is not a number of permits; expected a whole"),
        (["--permits", "17"], "--permits: '17' is not a number of permits; expected a whole"),
        (["--permits", "two"], "'two' is not a number of permits; expected a whole number 1-16"),
        (
            ["--permits", "2", "--policy", "replace"],
            "--permits: 2 permits with --policy replace are not supported yet",
        ),
    ],
)
def test_a_bad_permits_value_is_a_usage_error_naming_it(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_options(["run", "--lease", "ns/x", *args, "--", "true"], {})
    assert main(["run", "--lease", "ns/x", *args, "--", "true"], {"PATH": "/bin"}) == EXIT_CONFIG
    assert message in capsys.readouterr().err


def test_one_permit_in_a_store_is_todays_lock_and_allowed() -> None:
    options = parse_options(
        ["run", "--lease", "ns/x", "--permits", "1", "--store", "redis://h:6379/0", "--", "true"],
        {},
    )
    assert options.permits == 1


def test_permits_in_postgresql_are_allowed_its_trigger_keeps_their_rules() -> None:
    """PostgreSQL's rules 4 keep the permits' rules (docs/STORES.md, "Permits in a store")."""
    options = parse_options(
        [
            *("run", "--lease", "ns/x", "--permits", "16"),
            *("--store", "postgresql://team-a@db:5432/locks", "--", "true"),
        ],
        {},
    )
    assert options.permits == 16
    assert options.store is not None
    assert options.store.kind == "postgres"


def test_permits_in_redis_are_allowed_since_its_library_keeps_their_rules() -> None:
    """Redis' library v4 keeps the permit rules (docs/DECISIONS.md, "Permits in a store")."""
    options = parse_options(
        ["run", "--lease", "ns/x", "--permits", "3", "--store", "redis://h:6379/0", "--", "true"],
        {},
    )
    assert options.permits == 3
    assert options.store is not None
    assert options.store.kind == "redis"


def test_a_yield_request_on_a_lock_of_permits_stops_no_holder(
    transport: FakeTransport, clock: FakeClock
) -> None:
    transport.store(lock(2, A))
    mine = keeper(transport, clock, B, yields=True)
    assert isinstance(mine.try_acquire(), Acquired)
    assert transport.lease is not None
    asked = noted(transport.lease, ANNOTATION_YIELD_TO, C)
    transport.store(asked)  # a contender's note: our next renew conflicts and reads it
    clock.advance(5)
    assert mine.renew().outcome is RenewOutcome.RENEWED
    assert mine.held
    assert mine.replaced_by == ""
