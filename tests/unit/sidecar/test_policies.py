"""The replace and observe policies over the Lease protocol: fake clock, fake transport.

Two keepers share one fake Lease: the holder renewing and releasing as the sidecar does,
the contender deciding under its policy. A pause of the contender is where time passes
for both.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest

from cronlock_sidecar.contract import (
    ANNOTATION_OVERLAP,
    ANNOTATION_REPLACED_BY,
    ANNOTATION_REPLACED_JOBS,
    ANNOTATION_YIELD_TO,
    REPLACED_JOBS_KEPT,
)
from cronlock_sidecar.holding.lease import Acquired, Busy, LeaseKeeper, RenewOutcome
from cronlock_sidecar.holding.policy import acquire, note
from cronlock_sidecar.lock.model import read_lease, released, replace_wait_timeout
from cronlock_sidecar.options import ConfigError, parse_options
from tests.support.leases import make_lease
from tests.unit.sidecar.fakes import START

if TYPE_CHECKING:
    from tests.unit.sidecar.fakes import FakeClock, FakeTransport

MakeKeeper = Callable[..., LeaseKeeper]
OLD = "report-29001-aaaaa_11111111"
NEW = "report-29002-bbbbb_22222222"
NEWER = "report-29003-ccccc_33333333"


def annotations(transport: FakeTransport) -> dict[str, str]:
    assert transport.lease is not None
    return dict(transport.lease["metadata"].get("annotations") or {})


def holding(
    transport: FakeTransport, make_keeper: MakeKeeper, identity: str, job: str
) -> LeaseKeeper:
    keeper = make_keeper(identity=identity, job_name=job)
    assert isinstance(keeper.try_acquire(), Acquired)
    return keeper


def test_replace_asks_the_holder_to_yield_and_takes_the_lease_once_it_released(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(make_lease(transitions=4))
    old = holding(transport, make_keeper, OLD, "report-29001")
    clock.advance(5)
    events: list[str] = []

    def pause(seconds: float) -> bool:
        clock.advance(seconds)
        if not events:
            # The holder's next renewal reads the request: lost, its run is stopped.
            result = old.renew()
            events.append(f"renew {result.outcome.value}: {result.detail}")
            assert old.lost
            assert not old.held
            assert annotations(transport)[ANNOTATION_YIELD_TO] == NEW
        elif len(events) == 1:
            # Its run stopped (the pod's containers ended): the sidecar releases.
            events.append(f"released {old.release()}")
        return False

    contender = make_keeper(identity=NEW, job_name="report-29002")
    result = acquire(contender, policy="replace", wait_timeout=62, pause=pause)
    assert isinstance(result, Acquired)
    assert result.transitions == 6  # the old hold was 5: the fencing token moved on
    assert events == [f"renew lost: replaced by {NEW}; stopping this run", "released True"]
    assert old.replaced_by == NEW
    notes = annotations(transport)
    assert ANNOTATION_YIELD_TO not in notes  # the request is answered
    assert notes[ANNOTATION_REPLACED_BY] == NEW
    assert notes[ANNOTATION_REPLACED_JOBS] == "report-29001"
    assert read_lease(transport.lease or {}).holder == NEW


def test_a_holder_asked_to_yield_never_renews_again(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(make_lease(transitions=4))
    old = holding(transport, make_keeper, OLD, "report-29001")
    contender = make_keeper(identity=NEW)
    assert note(contender, ANNOTATION_YIELD_TO) is not None
    before = transport.lease
    assert old.renew().outcome is RenewOutcome.LOST
    assert old.renew().outcome is RenewOutcome.LOST
    assert transport.lease == before  # no renewal was written after the request
    assert old.check_deadline()  # the run counts as lost: it is stopped


def test_the_retry_pod_of_a_replaced_job_skips_instead_of_replacing_back(
    transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    yielded = {ANNOTATION_REPLACED_BY: NEW, ANNOTATION_REPLACED_JOBS: "report-29001"}
    transport.store(make_lease(NEW, annotations=yielded))

    def pause(seconds: float) -> bool:
        raise AssertionError("a replaced Job's retry must not wait")

    retry = make_keeper(identity="report-29001-ddddd_44444444", job_name="report-29001")
    result = acquire(retry, policy="replace", wait_timeout=62, pause=pause)
    assert isinstance(result, Busy)
    assert result.why == "replaced"
    assert ANNOTATION_YIELD_TO not in annotations(transport)
    # Free, too: the replacing run may not have taken it yet.
    transport.store(
        make_lease(
            annotations={ANNOTATION_REPLACED_BY: NEW, ANNOTATION_REPLACED_JOBS: "x,report-29001"}
        )
    )
    assert isinstance(acquire(retry, policy="skip", wait_timeout=0, pause=pause), Busy)


def test_a_replaced_jobs_list_no_yield_wrote_makes_no_run_skip(
    transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    """Security review M2: a list of future Jobs written without a replace run, or past the
    newest REPLACED_JOBS_KEPT, is not a yield's record; the runs it names claim as usual."""
    late = f"report-{29001 + REPLACED_JOBS_KEPT}"
    names = ",".join(f"report-{29001 + index}" for index in range(REPLACED_JOBS_KEPT + 1))
    for notes in (
        {ANNOTATION_REPLACED_JOBS: "report-29001"},
        {ANNOTATION_REPLACED_BY: NEW, ANNOTATION_REPLACED_JOBS: names},
    ):
        transport.store(make_lease(annotations=notes))
        job = "report-29001" if ANNOTATION_REPLACED_BY not in notes else late
        run = make_keeper(identity=f"{job}-ddddd_44444444", job_name=job)
        result = acquire(run, policy="skip", wait_timeout=0, pause=lambda seconds: False)
        assert isinstance(result, Acquired), (notes, result)
        run.release()


def test_replaced_jobs_keep_the_newest_first_and_are_bounded(
    transport: FakeTransport,
) -> None:
    lease = make_lease(OLD)
    for index in range(REPLACED_JOBS_KEPT + 3):
        lease = released(lease, OLD, START, replaced_by=NEW, job_name=f"job-{index}")
    jobs = read_lease(lease).replaced_jobs
    assert len(jobs) == REPLACED_JOBS_KEPT
    assert jobs[0] == f"job-{REPLACED_JOBS_KEPT + 2}"
    # A plain release keeps the record: a late retry of a replaced Job still skips.
    assert read_lease(released(lease, OLD, START)).replaced_jobs == jobs


def test_a_newer_replace_run_supersedes_an_older_waiting_one(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(make_lease(OLD, duration=3600))
    newer = make_keeper(identity=NEWER)

    def pause(seconds: float) -> bool:
        clock.advance(seconds)
        assert note(newer, ANNOTATION_YIELD_TO) is not None
        return False

    result = acquire(make_keeper(identity=NEW), policy="replace", wait_timeout=62, pause=pause)
    assert isinstance(result, Busy)
    assert (result.why, result.other) == ("superseded", NEWER)
    assert "newest run wins" in result.message()
    assert annotations(transport)[ANNOTATION_YIELD_TO] == NEWER


def test_a_holder_that_took_the_lease_after_we_started_is_newer_and_kept(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(make_lease(OLD, duration=3600))

    def pause(seconds: float) -> bool:
        clock.advance(seconds)
        # The old holder yielded and a newer run took the Lease before we saw it free, more
        # than the skew (2s) after we started.
        transport.store(make_lease(NEWER, renewed=clock.now() + timedelta(seconds=2.5)))
        return False

    result = acquire(make_keeper(identity=NEW), policy="replace", wait_timeout=62, pause=pause)
    assert isinstance(result, Busy)
    assert (result.why, result.other) == ("superseded", NEWER)
    assert ANNOTATION_YIELD_TO not in annotations(transport)  # NEWER is never asked


def test_a_holder_that_never_yields_is_a_skip_after_the_wait_timeout(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(make_lease(OLD, duration=3600))

    def pause(seconds: float) -> bool:
        clock.advance(seconds)
        return False

    started = clock.monotonic()
    result = acquire(make_keeper(identity=NEW), policy="replace", wait_timeout=62, pause=pause)
    assert isinstance(result, Busy)
    assert result.why == "not yielded"
    assert clock.monotonic() - started == pytest.approx(62)
    assert annotations(transport)[ANNOTATION_YIELD_TO] == NEW  # asked once, still there


def test_a_frozen_holder_is_replaced_only_once_its_lease_expired(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    """Never two at once: a holder that cannot read the request keeps the Lease to expiry."""
    transport.store(make_lease(OLD, renewed=START, duration=60, transitions=3))
    taken_at: list[float] = []

    def pause(seconds: float) -> bool:
        clock.advance(seconds)
        return False

    keeper = make_keeper(identity=NEW)
    wait = replace_wait_timeout(keeper.timing)
    assert wait == 60 + 2 + 20  # the default: ttl + skew + renew
    result = acquire(keeper, policy="replace", wait_timeout=wait, pause=pause)
    taken_at.append((clock.now() - START).total_seconds())
    assert isinstance(result, Acquired)
    assert result.reason == "expired"
    assert taken_at[0] > 60 + 2  # the duration plus the skew


def test_observe_notes_the_overlap_without_touching_the_hold(
    transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(make_lease(OLD, renewed=START - timedelta(seconds=3)))
    spec_before = dict((transport.lease or {})["spec"])
    observer = make_keeper(identity=NEW)
    result = acquire(observer, policy="observe", wait_timeout=0, pause=lambda _s: False)
    assert isinstance(result, Busy)
    assert not result.why
    assert note(observer, ANNOTATION_OVERLAP) is not None
    assert annotations(transport)[ANNOTATION_OVERLAP] == NEW
    assert (transport.lease or {})["spec"] == spec_before
    # Nothing to note on a free Lease (the observer would have taken it).
    transport.store(make_lease())
    assert note(observer, ANNOTATION_OVERLAP) is None


def test_replace_waits_ttl_plus_skew_plus_renew_by_default_and_observe_takes_no_wait_timeout() -> (
    None
):
    base = ["hold", "--lease", "default/cronlock-report", "--identity", NEW, "--ttl", "30s"]
    assert parse_options([*base, "--policy", "replace"], {}).wait_timeout == 30 + 2 + 10
    assert (
        parse_options([*base, "--policy", "replace", "--wait-timeout", "5s"], {}).wait_timeout == 5
    )
    with pytest.raises(ConfigError, match="only meaningful with --policy wait, replace or queue"):
        parse_options([*base, "--policy", "observe", "--wait-timeout", "5s"], {})
    with pytest.raises(ConfigError, match="replce"):
        parse_options([*base, "--policy", "replce"], {})


def test_a_holder_that_took_the_lease_within_the_skew_of_our_start_counts_as_older(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    """Wall clocks may differ by the skew: no order is read into less than that."""
    transport.store(make_lease(OLD, renewed=START + timedelta(seconds=1.5), duration=3600))
    result = acquire(
        make_keeper(identity=NEW), policy="replace", wait_timeout=0, pause=lambda _s: False
    )
    assert isinstance(result, Busy)
    assert result.why == "not yielded"
    assert annotations(transport)[ANNOTATION_YIELD_TO] == NEW  # asked, not superseded


# --- a frozen lock (`cronlock freeze`) ---------------------------------------------------------
def frozen_lease(until: timedelta, holder: str = "") -> dict[str, object]:
    from cronlock_sidecar.microtime import format_microtime

    return make_lease(
        holder,
        annotations={
            "cronlock.io/frozen-until": format_microtime(START + until),
            "cronlock.io/frozen-by": "alice@example.com",
            "cronlock.io/frozen-reason": "billing DB migration",
        },
    )


@pytest.mark.parametrize("policy", ["skip", "wait", "replace", "observe"])
def test_a_frozen_lock_skips_every_policy_at_once_and_says_until_when_and_why(
    transport: FakeTransport, make_keeper: MakeKeeper, policy: str
) -> None:
    transport.store(frozen_lease(timedelta(hours=2)))
    keeper = make_keeper(identity=NEW, job_name="report-29002")
    waited: list[float] = []
    result = acquire(
        keeper, policy=policy, wait_timeout=600, pause=lambda s: waited.append(s) or False
    )
    assert isinstance(result, Busy)
    assert result.why == "frozen"
    assert waited == [], "a freeze is not waited out"
    assert result.message() == (
        "lock frozen: lease default/cronlock-report frozen until 2026-11-29T10:00:00.000000Z "
        "by alice@example.com: billing DB migration; skipping this run"
    )
    assert transport.lease is not None
    assert read_lease(transport.lease).holder == ""


def test_a_freeze_ends_by_itself_at_its_time_and_leaves_the_holder_alone(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(frozen_lease(timedelta(seconds=30)))
    assert isinstance(make_keeper(identity=NEW).try_acquire(), Busy)
    clock.advance(31)  # past frozen-until on this pod's wall clock: no operator needed
    holder = make_keeper(identity=NEW)
    assert isinstance(holder.try_acquire(), Acquired)
    # Frozen again while it works: its renewals go on (only new runs skip).
    transport.store(
        {
            **transport.lease,  # type: ignore[dict-item]
            "metadata": {
                **transport.lease["metadata"],  # type: ignore[index]
                "annotations": {
                    **(transport.lease["metadata"].get("annotations") or {}),  # type: ignore[index]
                    "cronlock.io/frozen-until": "2099-01-01T00:00:00.000000Z",
                },
            },
        }
    )
    clock.advance(5)
    assert holder.renew().outcome is RenewOutcome.RENEWED


def test_a_freeze_with_stop_running_stops_the_holder_at_its_next_renewal(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(make_lease())
    holder = holding(transport, make_keeper, OLD, "report-29001")
    assert transport.lease is not None
    frozen = frozen_lease(timedelta(hours=1), holder=OLD)
    lease = dict(transport.lease)
    lease["metadata"] = {
        **transport.lease["metadata"],
        "annotations": {
            **(transport.lease["metadata"].get("annotations") or {}),
            **frozen["metadata"]["annotations"],  # type: ignore[index]
            "cronlock.io/frozen-stop": "true",
        },
    }
    transport.store(lease)  # a new resourceVersion: the holder's next write conflicts
    result = holder.renew()
    assert result.outcome is RenewOutcome.LOST
    assert result.detail == (
        "lock frozen until 2026-11-29T09:00:00.000000Z by alice@example.com: billing DB "
        "migration, with --stop-running; stopping this run"
    )
    # Not taken by another run: it gives the lock back once its work has stopped.
    assert holder.release()
    assert read_lease(transport.lease).holder == ""


def test_queue_is_a_cronjobs_policy_refused_by_run_and_waits_in_hold() -> None:
    base = ["--lease", "default/cronlock-report", "--ttl", "30s"]
    with pytest.raises(ConfigError, match="a process that should wait for the lock uses"):
        parse_options(["run", *base, "--policy", "queue", "--", "true"], {})
    held = parse_options(
        ["hold", *base, "--identity", NEW, "--policy", "queue", "--wait-timeout", "5m"], {}
    )
    assert held.policy == "queue"
    assert held.wait_timeout == 300


def test_a_queued_run_let_go_waits_for_a_run_that_slipped_in_then_takes_the_lock(
    clock: FakeClock, transport: FakeTransport, make_keeper: MakeKeeper
) -> None:
    transport.store(make_lease(OLD, duration=3600))
    waits: list[float] = []

    def pause(seconds: float) -> bool:
        waits.append(seconds)
        clock.advance(seconds)
        if len(waits) == 3:  # the other run gives the lock back
            transport.store(make_lease(""))
        return False

    result = acquire(make_keeper(identity=NEW), policy="queue", wait_timeout=60, pause=pause)
    assert isinstance(result, Acquired)
    assert len(waits) == 3
    # Without a release it skips at its timeout, as wait does.
    transport.store(make_lease(OLD, duration=3600))
    busy = acquire(make_keeper(identity=NEWER), policy="queue", wait_timeout=5, pause=pause)
    assert isinstance(busy, Busy)
