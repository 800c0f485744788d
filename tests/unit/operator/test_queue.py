"""policy: queue: the pure decider (which queued Job goes next, collapse, the queue
timeout), the injection's `suspend`, and the queue's annotations."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronlock_operator.cronjob.config import InvalidConfig, parse_config
from cronlock_operator.injection.build import build_injection, revert
from cronlock_operator.reconcile import queue
from cronlock_operator.reconcile.actions import DeleteJob, MarkJob, PostEvent, ResumeJob
from cronlock_operator.reconcile.keys import QueueKey
from cronlock_operator.runtime.reconciler import Reconciler
from cronlock_operator.runtime.workqueue import WorkQueue
from cronlock_operator.settings import OperatorSettings
from cronlock_sidecar import contract
from cronlock_sidecar.lock import permits
from cronlock_sidecar.microtime import format_microtime
from tests.support import gen
from tests.support.cronjobs import SETTINGS, job_from_cronjob
from tests.support.fakekube import FakeKube
from tests.support.leases import make_lease

NOW = datetime(2026, 12, 6, 16, 30, tzinfo=UTC)
QUEUE = {"cronlock.io/policy": "queue"}
TIMEOUTS = {"report": 600.0, "export": 600.0}
CRONJOBS: dict[str, dict[str, Any]] = {
    name: gen.cronjob(name, gen.annotated(QUEUE)) for name in TIMEOUTS
}


def tick_name(cronjob: str, at: datetime) -> str:
    return f"{cronjob}-{int(at.timestamp() // 60)}"


def job(
    name: str,
    cronjob: str = "report",
    *,
    created: datetime,
    suspended: bool = True,
    started: datetime | None = None,
    done: bool = False,
) -> dict[str, Any]:
    body = gen.job(
        name,
        gen.in_namespace("team-a"),
        gen.of_lock("report"),
        gen.created_at(format_microtime(created)),
        gen.with_metadata(
            resourceVersion=f"rv-{name}",
            ownerReferences=[
                {"kind": "CronJob", "name": cronjob, "uid": f"uid-{cronjob}", "controller": True}
            ],
        ),
    )
    body["spec"]["suspend"] = suspended
    status: dict[str, Any] = {}
    if started is not None:
        status["startTime"] = format_microtime(started)
    if done:
        status["conditions"] = [{"type": "Complete", "status": "True"}]
    body["status"] = status
    return body


def decide(lease: dict[str, Any], *jobs: dict[str, Any]) -> queue.QueueDecision:
    return queue.decide(lease, list(jobs), TIMEOUTS, CRONJOBS, NOW)


def resumed(decision: queue.QueueDecision) -> list[str]:
    return [action.name for action in decision.actions if isinstance(action, ResumeJob)]


def deleted(decision: queue.QueueDecision) -> list[str]:
    return [action.name for action in decision.actions if isinstance(action, DeleteJob)]


def reasons(decision: queue.QueueDecision) -> list[str]:
    return [action.reason for action in decision.actions if isinstance(action, PostEvent)]


FREE = make_lease(lock="report", namespace="team-a")
HELD = make_lease("report-28895790-abcde_0123abcd", lock="report", namespace="team-a")


def test_the_oldest_tick_goes_first_across_cronjobs_when_the_lock_is_free() -> None:
    older = job(tick_name("export", NOW - timedelta(minutes=3)), "export", created=NOW)
    newer = job(
        tick_name("report", NOW - timedelta(minutes=2)), created=NOW - timedelta(seconds=50)
    )
    decision = decide(FREE, newer, older)
    assert resumed(decision) == [older["metadata"]["name"]]
    assert reasons(decision) == [contract.EVENT_QUEUE_RELEASED]
    assert deleted(decision) == []


def test_manual_runs_go_in_creation_order() -> None:
    first = job("report-manual-b", created=NOW - timedelta(seconds=20))
    second = job("report-manual-a", created=NOW - timedelta(seconds=10))
    assert resumed(decide(FREE, second, first)) == ["report-manual-b"]


def test_nothing_goes_while_the_lock_is_held_or_frozen() -> None:
    queued = job("report-manual", created=NOW - timedelta(seconds=5))
    assert resumed(decide(HELD, queued)) == []
    frozen = make_lease(
        lock="report",
        namespace="team-a",
        annotations={contract.ANNOTATION_FROZEN_UNTIL: format_microtime(NOW + timedelta(1))},
    )
    assert resumed(decide(frozen, queued)) == []


def test_one_at_a_time_a_job_let_go_blocks_the_next_until_its_pod_held() -> None:
    let_go = job("report-manual-1", created=NOW - timedelta(seconds=30), suspended=False)
    waiting = job("report-manual-2", created=NOW - timedelta(seconds=20))
    assert resumed(decide(FREE, let_go, waiting)) == []
    # Started, not yet holding: still in flight.
    starting = job(
        "report-manual-1",
        created=NOW - timedelta(seconds=30),
        suspended=False,
        started=NOW - timedelta(seconds=3),
    )
    assert resumed(decide(FREE, starting, waiting)) == []
    # Its pod took the lock and gave it back since it started: the next one goes.
    released = make_lease(
        lock="report",
        namespace="team-a",
        annotations={
            contract.ANNOTATION_LAST_HOLDER: "report-manual-1-x7k2p_0123abcd",
            contract.ANNOTATION_RELEASED_AT: format_microtime(NOW - timedelta(seconds=1)),
        },
    )
    assert resumed(decide(released, starting, waiting)) == ["report-manual-2"]
    # A release by an earlier pod of the same name prefix, before it started, is not its.
    earlier = make_lease(
        lock="report",
        namespace="team-a",
        annotations={
            contract.ANNOTATION_LAST_HOLDER: "report-manual-1-x7k2p_0123abcd",
            contract.ANNOTATION_RELEASED_AT: format_microtime(NOW - timedelta(seconds=9)),
        },
    )
    assert resumed(decide(earlier, starting, waiting)) == []


def test_a_job_let_go_that_never_starts_blocks_the_queue_only_for_the_start_bound() -> None:
    stuck = job(
        "report-manual-1",
        created=NOW - timedelta(seconds=400),
        suspended=False,
        started=NOW - timedelta(seconds=queue.START_BOUND_SECONDS + 1),
    )
    waiting = job("report-manual-2", created=NOW - timedelta(seconds=20))
    assert resumed(decide(FREE, stuck, waiting)) == ["report-manual-2"]


def test_a_finished_job_is_no_longer_in_flight() -> None:
    done = job("report-manual-1", created=NOW, suspended=False, started=NOW, done=True)
    waiting = job("report-manual-2", created=NOW)
    assert resumed(decide(FREE, done, waiting)) == ["report-manual-2"]


def test_newer_ticks_of_one_cronjob_collapse_into_the_oldest_queued() -> None:
    ticks_ = [
        job(tick_name("report", NOW - timedelta(minutes=m)), created=NOW - timedelta(minutes=m))
        for m in (3, 2, 1)
    ]
    manual = job("report-manual", created=NOW - timedelta(seconds=5))
    decision = decide(HELD, *ticks_, manual)
    assert deleted(decision) == [ticks_[1]["metadata"]["name"], ticks_[2]["metadata"]["name"]]
    assert reasons(decision) == [contract.EVENT_QUEUE_COLLAPSED] * 2
    assert resumed(decision) == []
    # Only the version judged is deleted: one let go meanwhile stays.
    assert {action.version for action in decision.actions if isinstance(action, DeleteJob)} == {
        f"rv-{ticks_[1]['metadata']['name']}",
        f"rv-{ticks_[2]['metadata']['name']}",
    }


def marked(decision: queue.QueueDecision) -> list[str]:
    return [
        action.name
        for action in decision.actions
        if isinstance(action, MarkJob) and action.annotation == "cronlock.io/queue-timed-out"
    ]


def test_a_job_queued_past_its_timeout_is_marked_for_the_run_accounting() -> None:
    old = job("report-manual-old", created=NOW - timedelta(seconds=601))
    young = job("report-manual-young", created=NOW - timedelta(seconds=100))
    decision = decide(HELD, old, young)
    assert marked(decision) == ["report-manual-old"]
    assert deleted(decision) == []
    assert reasons(decision) == []
    (mark,) = decision.actions
    assert isinstance(mark, MarkJob)
    assert mark.value == "queued 10m1s, longer than its cronlock.io/queue-timeout 10m"
    # It looks again when the younger one would time out.
    assert decision.requeue_after == pytest.approx(500.0)
    # Once marked it is no longer queued: nothing more is decided about it.
    old["metadata"]["annotations"] = {"cronlock.io/queue-timed-out": mark.value}
    assert marked(decide(HELD, old, young)) == []


def test_a_timed_out_tick_makes_room_for_the_next_tick_instead_of_collapsing_it() -> None:
    old = job(tick_name("report", NOW - timedelta(minutes=11)), created=NOW - timedelta(minutes=11))
    new = job(tick_name("report", NOW - timedelta(minutes=1)), created=NOW - timedelta(minutes=1))
    decision = decide(FREE, old, new)
    assert marked(decision) == [old["metadata"]["name"]]
    assert deleted(decision) == []
    assert resumed(decision) == [new["metadata"]["name"]]


def test_jobs_of_cronjobs_not_under_queue_are_left_alone() -> None:
    other = job("nightly-manual", "nightly", created=NOW - timedelta(days=1))
    assert decide(FREE, other).actions == []


def test_pod_of_follows_the_job_controllers_pod_names() -> None:
    assert queue.pod_of("report-28895790", "report-28895790-abcde_0123abcd")
    assert not queue.pod_of("report-2889579", "report-28895790-abcde_0123abcd")
    long_job = "a" * 52 + "-28895790"
    assert queue.pod_of(long_job, (long_job + "-")[:58] + "xyz12_0123abcd")


# --- the injection and the annotations ----------------------------------------------


def queue_cronjob(*extra: gen.Modifier, **notes: str) -> dict[str, Any]:
    return gen.cronjob(
        "report", gen.in_namespace("team-a"), gen.annotated({**QUEUE, **notes}), *extra
    )


def test_injection_under_queue_suspends_each_job_and_revert_removes_it() -> None:
    user = queue_cronjob()
    injected = build_injection(user, parse_config(user, SETTINGS), SETTINGS)
    assert injected["spec"]["jobTemplate"]["spec"]["suspend"] is True
    assert (
        queue.queue_lock(
            {
                **injected["spec"]["jobTemplate"],
                "metadata": {"labels": {contract.LABEL_LOCK: "report"}},
            }
        )
        == "report"
    )
    assert revert(injected) == user
    assert build_injection(injected, parse_config(injected, SETTINGS), SETTINGS) == injected


def test_a_policy_changed_from_queue_drops_suspend_and_a_users_own_suspend_is_kept() -> None:
    injected = build_injection(queue_cronjob(), parse_config(queue_cronjob(), SETTINGS), SETTINGS)
    injected["metadata"]["annotations"]["cronlock.io/policy"] = "wait"
    again = build_injection(injected, parse_config(injected, SETTINGS), SETTINGS)
    assert "suspend" not in again["spec"]["jobTemplate"]["spec"]
    mine = gen.cronjob("report", gen.in_namespace("team-a"), gen.with_job(suspend=True))
    kept = build_injection(mine, parse_config(mine, SETTINGS), SETTINGS)
    assert kept["spec"]["jobTemplate"]["spec"]["suspend"] is True
    assert revert(kept) == mine


def test_a_users_own_suspend_under_queue_is_refused_with_what_to_do() -> None:
    user = queue_cronjob(gen.with_job(suspend=False))
    with pytest.raises(InvalidConfig, match="sets suspend: false; under queue"):
        build_injection(user, parse_config(user, SETTINGS), SETTINGS)


def test_the_queue_timeout_defaults_to_the_schedules_shortest_gap() -> None:
    assert parse_config(queue_cronjob(), SETTINGS).queue_timeout_seconds == 300
    config = parse_config(queue_cronjob(**{"cronlock.io/queue-timeout": "90s"}), SETTINGS)
    assert config.queue_timeout_seconds == 90
    # The let-go pod that finds the lock taken waits as long.
    assert config.wait_timeout_seconds == 90


@pytest.mark.parametrize(
    ("notes", "says"),
    [
        ({"cronlock.io/queue-timeout": "0s"}, "out of range"),
        ({"cronlock.io/queue-timeout": "25h"}, "out of range"),
        ({"cronlock.io/queue-timeout": "soon"}, "queue-timeout"),
        ({"cronlock.io/wait-timeout": "1m"}, "set that instead"),
        ({"cronlock.io/policy": "wait", "cronlock.io/queue-timeout": "1m"}, "only applies"),
    ],
)
def test_bad_queue_settings_are_refused_clearly(notes: dict[str, str], says: str) -> None:
    with pytest.raises(InvalidConfig, match=says):
        parse_config(queue_cronjob(**notes), SETTINGS)


def test_queue_with_a_store_is_refused_the_operator_cannot_see_its_releases() -> None:
    settings = OperatorSettings(
        sidecar_image="ghcr.io/example/cronlock:1.0.0",
        sidecar_stores_image="ghcr.io/example/cronlock:1.0.0-stores",
    )
    notes = {"cronlock.io/store": "redis", "cronlock.io/store-secret": "lock-url"}
    with pytest.raises(InvalidConfig, match="needs the lock in a Lease"):
        parse_config(queue_cronjob(**notes), settings)


def test_only_the_job_let_go_last_can_be_in_flight() -> None:
    # report-1 held and released, its pod still ending; report-2, let go after it, held
    # and released too: report-3 goes, report-1 (no longer the last holder) holds nothing.
    earlier = NOW - timedelta(seconds=30)
    first = job("report-manual-1", created=earlier, suspended=False, started=earlier)
    second = job(
        "report-manual-2",
        created=earlier,
        suspended=False,
        started=NOW - timedelta(seconds=10),
    )
    third = job("report-manual-3", created=earlier + timedelta(seconds=1))
    released = make_lease(
        lock="report",
        namespace="team-a",
        annotations={
            contract.ANNOTATION_LAST_HOLDER: "report-manual-2-x7k2p_0123abcd",
            contract.ANNOTATION_RELEASED_AT: format_microtime(NOW - timedelta(seconds=1)),
        },
    )
    assert resumed(decide(released, first, second, third)) == ["report-manual-3"]
    # While report-2 has not held yet, it blocks report-3.
    assert resumed(decide(FREE, first, second, third)) == []


def permits_lock(count: int, *holders: str) -> dict[str, Any]:
    """A lock of `count` permits, held by `holders` (permit 0 first; "" for free)."""
    spec_holder, *others = [*holders, *[""] * count][:count]
    at = NOW - timedelta(seconds=1)
    entries = {
        permits.permit_key(number): permits.Permit(
            number, holder, at, at, 60, 1, holder.rpartition("-")[0] if holder else ""
        ).text()
        for number, holder in enumerate(others, start=1)
    }
    return make_lease(
        spec_holder,
        lock="report",
        namespace="team-a",
        renewed=at,
        annotations={contract.ANNOTATION_PERMITS: str(count), **entries},
    )


def test_with_n_permits_each_free_permit_lets_the_next_oldest_go() -> None:
    queued = [
        job(f"report-manual-{n}", created=NOW - timedelta(seconds=10 - n)) for n in range(1, 5)
    ]
    # Three permits, one held by a run of another Job: two free, the two oldest go.
    assert resumed(decide(permits_lock(3, "", "nightly-1-abcde_0123abcd"), *queued)) == [
        "report-manual-1",
        "report-manual-2",
    ]
    # All held: none goes; the spec free alone: the oldest goes.
    full = permits_lock(2, "nightly-1-abcde_0123abcd", "nightly-2-abcde_0123abcd")
    assert resumed(decide(full, *queued)) == []
    assert resumed(decide(permits_lock(2, "", "nightly-2-abcde_0123abcd"), *queued)) == [
        "report-manual-1"
    ]


def test_with_n_permits_a_job_let_go_takes_a_free_permit_until_its_pod_holds_one() -> None:
    earlier = NOW - timedelta(seconds=5)
    starting = job("report-manual-1", created=earlier, suspended=False, started=earlier)
    waiting = [job(f"report-manual-{n}", created=NOW - timedelta(seconds=4 - n)) for n in (2, 3)]
    # Two free permits, one spoken for by report-manual-1 starting: one more goes.
    assert resumed(decide(permits_lock(2), starting, *waiting)) == ["report-manual-2"]
    # Its pod holds permit 1 now: the other free permit goes to report-manual-2.
    holding = permits_lock(2, "", "report-manual-1-x7k2p_0123abcd")
    assert resumed(decide(holding, starting, *waiting)) == ["report-manual-2"]
    # Both let go are starting, the lock is free: nothing more goes until one holds.
    second = job("report-manual-2", created=earlier, suspended=False, started=NOW)
    assert resumed(decide(permits_lock(2), starting, second, waiting[1])) == []


def test_permits_with_queue_are_one_config() -> None:
    cronjob = queue_cronjob(**{contract.ANNOTATION_PERMITS: "3"})
    config = parse_config(cronjob, SETTINGS)
    assert (config.policy, config.permits) == ("queue", 3)


# --- the runtime: watch events to keys, the reconcile's writes ----------------------


def test_the_watches_ask_for_the_locks_queue_and_its_reconcile_lets_the_oldest_go() -> None:
    kube = FakeKube()
    reconciler = Reconciler(kube=kube, settings=SETTINGS)
    reconciler.queue = WorkQueue(reconciler.queue.work)  # what is queued from here on
    user = queue_cronjob(gen.with_uid("uid-report"))
    body = build_injection(user, parse_config(user, SETTINGS), SETTINGS)
    body["metadata"]["resourceVersion"] = "7"
    reconciler.cronjobs.put(body)
    kube.leases[("team-a", "cronlock-report")] = make_lease(lock="report", namespace="team-a")
    key = QueueKey("team-a", "report")
    for name, age in (("report-manual-2", 5), ("report-manual-1", 9)):
        made = copy.deepcopy(job_from_cronjob(body, name))
        made["metadata"].update(
            namespace="team-a",
            uid=f"uid-{name}",
            resourceVersion="1",
            creationTimestamp=format_microtime(datetime.now(UTC) - timedelta(seconds=age)),
        )
        kube.jobs[("team-a", name)] = made
        reconciler.on_job("ADDED", made)
    assert reconciler.queue.waiting(key)
    asyncio.run(reconciler._reconcile(key))
    assert kube.called("resume_job") == [("team-a", "report-manual-1")]
    assert kube.jobs[("team-a", "report-manual-1")]["spec"]["suspend"] is False
    assert kube.jobs[("team-a", "report-manual-2")]["spec"]["suspend"] is True
    assert kube.reasons() == [contract.EVENT_QUEUE_RELEASED]

    # A held Lease asks for nothing; a free one asks for the lock's queue again.
    reconciler.queue = WorkQueue(reconciler.queue.work)
    held = make_lease("report-manual-1-abcde_0123abcd", lock="report", namespace="team-a")
    reconciler.on_lease("MODIFIED", held)
    assert not reconciler.queue.waiting(key)
    reconciler.on_lease("MODIFIED", make_lease(lock="report", namespace="team-a"))
    assert reconciler.queue.waiting(key)
    # A lock of two permits with one free asks for its queue too.
    reconciler.queue = WorkQueue(reconciler.queue.work)
    reconciler.on_lease("MODIFIED", permits_lock(2, "report-manual-1-abcde_0123abcd"))
    assert reconciler.queue.waiting(key)
    reconciler.queue = WorkQueue(reconciler.queue.work)
    full = permits_lock(2, "report-manual-1-abcde_0123abcd", "report-manual-2-abcde_0123abcd")
    reconciler.on_lease("MODIFIED", full)
    assert not reconciler.queue.waiting(key)
    # A Job of a CronJob under another policy is no queue's business.
    other = gen.job("nightly-1", gen.in_namespace("team-a"), gen.of_lock("report"))
    reconciler.queue = WorkQueue(reconciler.queue.work)
    reconciler.on_job("ADDED", other)
    assert not reconciler.queue.waiting(key)


def test_a_job_being_deleted_is_neither_collapsed_again_nor_let_go() -> None:
    older = job(tick_name("report", NOW - timedelta(minutes=2)), created=NOW)
    newer = job(tick_name("report", NOW - timedelta(minutes=1)), created=NOW)
    newer["metadata"]["deletionTimestamp"] = format_microtime(NOW)
    decision = decide(HELD, older, newer)
    assert decision.actions == []
    assert resumed(decide(FREE, newer)) == []
