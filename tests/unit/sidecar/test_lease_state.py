"""The Lease protocol against a fake clock and a fake transport."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest

from cronlock_sidecar.contract import (
    ANNOTATION_HOLDER_JOB,
    ANNOTATION_LAST_HOLDER,
    ANNOTATION_RELEASED_AT,
)
from cronlock_sidecar.holding.lease import Acquired, Busy, LeaseKeeper, RenewOutcome
from cronlock_sidecar.holding.policy import acquire
from cronlock_sidecar.lock.model import Timing
from cronlock_sidecar.transport.seam import Conflict, Forbidden, NotFound, Unavailable

if TYPE_CHECKING:
    from tests.unit.sidecar.fakes import FakeClock, FakeTransport

from tests.support.leases import make_lease
from tests.unit.sidecar.fakes import LEASE, START

MakeKeeper = Callable[..., LeaseKeeper]
ME = "pod-b_22222222"
OTHER = "pod-a_11111111"
MICROTIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def test_free_lease_is_acquired_with_a_new_transition(
    transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(make_lease(transitions=4))
    result = make_keeper(job_name="report-29001").try_acquire()
    assert isinstance(result, Acquired)
    assert result.transitions == 5
    spec = transport.lease["spec"] if transport.lease else {}
    assert spec["holderIdentity"] == ME
    assert spec["leaseTransitions"] == 5
    assert spec["leaseDurationSeconds"] == 60
    assert spec["acquireTime"] == spec["renewTime"] == "2026-11-29T08:00:00.000000Z"
    assert transport.lease
    assert transport.lease["metadata"]["annotations"][ANNOTATION_HOLDER_JOB] == "report-29001"


def test_acquire_writes_with_the_resource_version_it_read(
    transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(make_lease())
    read_version = transport.lease["metadata"]["resourceVersion"] if transport.lease else ""
    make_keeper().try_acquire()
    [write] = transport.writes()
    assert write is not None
    assert write["metadata"]["resourceVersion"] == read_version


def test_fractional_ttl_is_written_as_whole_seconds_rounded_up(
    transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(make_lease())
    make_keeper(ttl=1.5, renew=0.5).try_acquire()
    assert transport.lease
    assert transport.lease["spec"]["leaseDurationSeconds"] == 2


def test_live_holder_makes_us_skip_with_one_readable_line(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(make_lease(OTHER, renewed=START - timedelta(seconds=3)))
    result = make_keeper().try_acquire()
    assert isinstance(result, Busy)
    assert result.message() == (
        "already running: lease default/cronlock-report held by pod-a_11111111 "
        "(renewed 3s ago, expires in 57s); skipping this run"
    )
    assert transport.writes() == []


@pytest.mark.parametrize(
    ("renewed_ago", "taken"),
    [(61.9, False), (62.0, False), (62.1, True), (600, True)],
    ids=["inside-skew", "at-ttl-plus-skew", "just-past", "long-dead"],
)
def test_expiry_is_renew_time_plus_duration_plus_skew(
    transport: FakeTransport, make_keeper: MakeKeeper, renewed_ago: float, taken: bool
) -> None:
    transport.store(make_lease(OTHER, renewed=START - timedelta(seconds=renewed_ago)))
    result = make_keeper().try_acquire()
    assert isinstance(result, Acquired) is taken
    if taken:
        assert transport.lease
        assert transport.lease["spec"]["holderIdentity"] == ME


def test_restarted_sidecar_resumes_without_a_new_transition(
    transport: FakeTransport, make_keeper: MakeKeeper, clock: FakeClock
) -> None:
    transport.store(make_lease(ME, renewed=START - timedelta(seconds=10), transitions=7))
    clock.advance(1)
    result = make_keeper().try_acquire()
    assert isinstance(result, Acquired)
    assert result.resumed
    assert result.transitions == 7
    assert transport.lease
    spec = transport.lease["spec"]
    assert spec["leaseTransitions"] == 7
    assert spec["acquireTime"] == "2026-11-29T07:59:50.000000Z"
    assert spec["renewTime"] == "2026-11-29T08:00:01.000000Z"


def test_earlier_pod_of_the_same_job_is_taken_over_at_once(
    transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(
        make_lease(OTHER, annotations={ANNOTATION_HOLDER_JOB: "report-29001"}, transitions=2)
    )
    result = make_keeper(job_name="report-29001").try_acquire()
    assert isinstance(result, Acquired)
    assert result.transitions == 3
    assert result.reason == "earlier pod of the same Job"


def test_a_live_holder_of_another_job_is_not_taken_over(
    transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(make_lease(OTHER, annotations={ANNOTATION_HOLDER_JOB: "report-29000"}))
    assert isinstance(make_keeper(job_name="report-29001").try_acquire(), Busy)


def test_no_job_name_removes_a_stale_holder_job_annotation(
    transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(make_lease(annotations={ANNOTATION_HOLDER_JOB: "report-29000"}))
    make_keeper().try_acquire()
    assert transport.lease
    assert ANNOTATION_HOLDER_JOB not in transport.lease["metadata"]["annotations"]


def test_race_lost_on_409_rereads_and_skips_for_the_winner(
    transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(make_lease())
    transport.before_write.append(lambda fake: fake.store(make_lease(OTHER, transitions=5)))
    result = make_keeper().try_acquire()
    assert isinstance(result, Busy)
    assert result.holder == OTHER
    assert transport.lease
    assert transport.lease["spec"]["holderIdentity"] == OTHER


def test_409_where_the_other_writer_did_not_take_it_is_retried(
    transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(make_lease(transitions=1))
    transport.before_write.append(lambda fake: fake.store(make_lease(transitions=1)))
    result = make_keeper().try_acquire()
    assert isinstance(result, Acquired)
    assert result.transitions == 2


def test_missing_lease_is_created_with_us_as_holder(
    transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    result = make_keeper().try_acquire()
    assert isinstance(result, Acquired)
    assert transport.lease
    assert transport.lease["spec"]["holderIdentity"] == ME
    assert transport.lease["spec"]["leaseTransitions"] == 1
    assert transport.lease["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "cronlock"}


def test_create_race_lost_rereads_the_winner(
    transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.fail("create", Conflict("create", LEASE, "already exists"))
    transport.failures["get"].append(NotFound("get", LEASE, "not found"))
    transport.store(make_lease(OTHER))
    assert isinstance(make_keeper().try_acquire(), Busy)


def test_forbidden_create_fails_closed_naming_verb_and_lease(
    transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.fail("create", Forbidden("create", LEASE, "HTTP 403: forbidden"))
    with pytest.raises(Forbidden, match=r"forbidden: cannot create lease default/cronlock-report"):
        make_keeper().try_acquire()


def test_unreachable_api_fails_closed(transport: FakeTransport, make_keeper: MakeKeeper) -> None:
    transport.fail("get", Unavailable("get", LEASE, "connection refused"))
    with pytest.raises(Unavailable, match="cannot get lease default/cronlock-report"):
        make_keeper().try_acquire()


def test_wait_policy_takes_the_lease_once_it_is_released(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(make_lease(OTHER))
    pauses: list[float] = []

    def pause(seconds: float) -> bool:
        pauses.append(seconds)
        clock.advance(seconds)
        if len(pauses) == 3:
            transport.store(make_lease(transitions=9))
        return False

    result = acquire(make_keeper(), policy="wait", wait_timeout=30, pause=pause)
    assert isinstance(result, Acquired)
    assert result.transitions == 10
    assert pauses == [1.0, 1.0, 1.0]


def test_wait_policy_gives_up_after_the_timeout(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(make_lease(OTHER, duration=3600))

    def pause(seconds: float) -> bool:
        clock.advance(seconds)
        return False

    started = clock.monotonic()
    result = acquire(make_keeper(), policy="wait", wait_timeout=5, pause=pause)
    assert isinstance(result, Busy)
    assert clock.monotonic() - started == pytest.approx(5)


POLICY_DENIAL = (
    'HTTP 403: leases.coordination.k8s.io "cronlock-report" is forbidden: '
    "ValidatingAdmissionPolicy 'cronlock-lease-holders' with binding 'cronlock-lease-holders' "
    "denied request: cronlock holder policy: the Lease is held by pod-a_11111111; ..."
)


def test_an_expired_hold_the_admission_policy_keeps_is_waited_for_until_the_operator_clears_it(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    """Under skip too: one renew interval plus the skew, then the cleared Lease is taken."""
    transport.store(make_lease(OTHER, renewed=START - timedelta(seconds=70)))
    transport.fail("replace", *[Forbidden("update", LEASE, POLICY_DENIAL)] * 100)
    pauses: list[float] = []

    def pause(seconds: float) -> bool:
        pauses.append(seconds)
        clock.advance(seconds)
        if len(pauses) == 4:  # the operator clears it: a free Lease may be claimed
            transport.store(make_lease(transitions=9))
            transport.failures["replace"].clear()
        return False

    result = acquire(make_keeper(), policy="skip", wait_timeout=0, pause=pause)
    assert isinstance(result, Acquired)
    assert result.transitions == 10
    assert pauses == [1.0] * 4


def test_an_expired_hold_the_operator_never_clears_is_a_skip_after_renew_plus_skew(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(make_lease(OTHER, renewed=START - timedelta(seconds=70)))
    denial = Forbidden("update", LEASE, POLICY_DENIAL)
    transport.fail("replace", *([denial] * 100))

    def pause(seconds: float) -> bool:
        clock.advance(seconds)
        return False

    started = clock.monotonic()
    result = acquire(make_keeper(), policy="skip", wait_timeout=0, pause=pause)
    assert isinstance(result, Busy)
    assert result.clearing
    assert clock.monotonic() - started == pytest.approx(20 + 2)  # renew 20s, skew 2s
    assert "leaves clearing it to the operator" in result.message()


def test_any_other_refusal_of_a_takeover_still_fails_closed(
    transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(make_lease(OTHER, renewed=START - timedelta(seconds=70)))
    transport.fail("replace", Forbidden("update", LEASE, "HTTP 403: forbidden by RBAC"))
    with pytest.raises(Forbidden):
        make_keeper().try_acquire()


def test_skip_policy_never_waits(transport: FakeTransport, make_keeper: MakeKeeper) -> None:
    transport.store(make_lease(OTHER))

    def pause(seconds: float) -> bool:
        raise AssertionError("skip must not wait")

    assert isinstance(acquire(make_keeper(), policy="skip", wait_timeout=0, pause=pause), Busy)


# --- renew -------------------------------------------------------------------------
def held(transport: FakeTransport, make_keeper: MakeKeeper, **kwargs: float) -> LeaseKeeper:
    transport.store(make_lease(transitions=0))
    keeper = make_keeper(**kwargs)
    assert isinstance(keeper.try_acquire(), Acquired)
    return keeper


def test_renew_moves_renew_time_and_keeps_everything_else(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    keeper = held(transport, make_keeper)
    before = transport.lease["spec"] if transport.lease else {}
    clock.advance(20)
    assert keeper.renew().outcome is RenewOutcome.RENEWED
    assert transport.lease
    after = transport.lease["spec"]
    assert after["renewTime"] == "2026-11-29T08:00:20.000000Z"
    assert {k: v for k, v in after.items() if k != "renewTime"} == {
        k: v for k, v in before.items() if k != "renewTime"
    }


def test_renew_after_holder_changed_is_lost_at_once(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    keeper = held(transport, make_keeper)
    transport.store(make_lease(OTHER, transitions=2))
    result = keeper.renew()
    assert result.outcome is RenewOutcome.LOST
    assert "now held by pod-a_11111111" in result.detail
    assert keeper.lost
    assert not keeper.held


def test_renew_conflict_while_still_ours_rereads_and_retries(
    transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    keeper = held(transport, make_keeper)
    assert transport.lease
    transport.store(transport.lease)  # an unrelated write bumps the resourceVersion
    assert keeper.renew().outcome is RenewOutcome.RENEWED
    assert keeper.held


def test_renew_of_a_deleted_lease_is_lost(
    transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    keeper = held(transport, make_keeper)
    transport.lease = None
    assert keeper.renew().outcome is RenewOutcome.LOST


def test_renew_failures_are_tolerated_until_the_deadline_then_lost(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    keeper = held(transport, make_keeper, ttl=30, renew=10)  # renew deadline 20s
    for _ in range(19):
        clock.advance(1)
        transport.fail("replace", Unavailable("update", LEASE, "connection refused"))
        assert keeper.renew().outcome is RenewOutcome.FAILED
        assert not keeper.check_deadline()
        assert keeper.held
    clock.advance(1)
    assert keeper.check_deadline()
    assert keeper.lost
    assert keeper.renew().outcome is RenewOutcome.LOST


def test_renew_deadline_counts_from_when_the_last_good_renew_was_sent(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    keeper = held(transport, make_keeper, ttl=30, renew=10)
    clock.advance(10)
    sent_at = clock.monotonic()

    def slow_answer(fake: FakeTransport) -> None:
        clock.advance(4)  # the request takes 4s to come back

    transport.before_write.append(slow_answer)
    assert keeper.renew().outcome is RenewOutcome.RENEWED
    assert keeper.valid_until() == pytest.approx(sent_at + 20)


def test_self_fencing_ignores_wall_clock_jumps(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    keeper = held(transport, make_keeper, ttl=30, renew=10)
    clock.wall += timedelta(hours=3)
    assert not keeper.check_deadline()
    clock.mono += 20
    assert keeper.check_deadline()


def test_a_lost_lease_is_never_reacquired(
    transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    keeper = held(transport, make_keeper)
    transport.store(make_lease(OTHER))
    keeper.renew()
    transport.store(make_lease())
    with pytest.raises(RuntimeError, match="never re-acquired"):
        keeper.try_acquire()


# --- release -----------------------------------------------------------------------
def test_release_clears_the_holder_and_keeps_the_transitions(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    keeper = held(transport, make_keeper)
    clock.advance(5)
    assert keeper.release()
    assert transport.lease
    spec = transport.lease["spec"]
    assert "holderIdentity" not in spec
    assert spec["leaseTransitions"] == 1
    annotations = transport.lease["metadata"]["annotations"]
    assert annotations[ANNOTATION_LAST_HOLDER] == ME
    assert annotations[ANNOTATION_RELEASED_AT] == "2026-11-29T08:00:05.000000Z"
    assert MICROTIME.match(annotations[ANNOTATION_RELEASED_AT])
    assert not keeper.held


def test_release_never_touches_a_lease_someone_else_holds(
    transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    keeper = held(transport, make_keeper)
    transport.store(make_lease(OTHER, transitions=2))
    assert not keeper.release()
    assert transport.lease
    assert transport.lease["spec"]["holderIdentity"] == OTHER


def test_release_after_a_conflict_retries_while_still_ours(
    transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    keeper = held(transport, make_keeper)
    assert transport.lease
    transport.store(transport.lease)
    assert keeper.release()
    assert transport.lease
    assert "holderIdentity" not in transport.lease["spec"]


def test_release_gives_up_within_its_budget(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    keeper = held(transport, make_keeper)

    def hang(fake: FakeTransport) -> None:
        clock.advance(3.5)

    transport.before_write.append(hang)
    transport.fail("replace", Unavailable("update", LEASE, "timed out"))
    assert not keeper.release(budget=3.0)
    assert len(transport.writes()) == 2  # the acquire and one release attempt


def test_nothing_to_release_when_never_acquired(
    transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(make_lease(OTHER))
    keeper = make_keeper()
    keeper.try_acquire()
    assert not keeper.release()
    assert transport.writes() == []


@pytest.mark.parametrize(
    ("renewed_ago", "caps", "taken"),
    [(62.1, False, False), (61.9, True, False), (62.1, True, True), (3600, False, False)],
    ids=["lease-believes-the-day", "store-inside-ttl-plus-skew", "store-past", "lease-an-hour"],
)
def test_a_store_lock_believes_a_day_long_hold_only_for_its_own_ttl(
    clock: FakeClock,
    transport: FakeTransport,
    renewed_ago: float,
    caps: bool,
    taken: bool,
) -> None:
    """Whoever has a store's URL may write a day-long hold; a store run (ttl 60s, skew 2s)
    takes it once 62s have passed since its renewal, as the store's own rule allows; on a
    Lease (which the holders' policy and the operator bound) the written duration counts."""
    transport.store(
        make_lease(OTHER, renewed=START - timedelta(seconds=renewed_ago), duration=86400)
    )
    keeper = LeaseKeeper(transport, LEASE, ME, Timing.of(60, 20, 2), clock, "", caps_holds=caps)
    result = keeper.try_acquire()
    assert isinstance(result, Acquired) is taken
    if not taken:
        assert isinstance(result, Busy)
        assert result.holder == OTHER


@pytest.mark.parametrize(
    ("silent", "resumed"),
    [(10, True), (39.9, True), (40.0, False), (45, False), (3600, False)],
    ids=["fresh", "just-inside", "at-the-deadline", "past-it", "an-hour"],
)
def test_resume_renews_only_a_hold_renewed_within_the_renew_deadline(
    transport: FakeTransport, make_keeper: MakeKeeper, silent: float, resumed: bool
) -> None:
    # ttl 60 s: the renew deadline is 40 s. A hold of ours silent for longer ended then (its
    # run should have been stopped): a restarted sidecar fails closed instead of renewing it.
    transport.store(make_lease(ME, renewed=START - timedelta(seconds=silent), transitions=7))
    keeper = make_keeper()
    result = keeper.resume()
    assert isinstance(result, Acquired) is resumed
    assert keeper.lost is not resumed
    assert len(transport.writes()) == (1 if resumed else 0)
    assert transport.lease
    assert transport.lease["spec"]["leaseTransitions"] == 7
