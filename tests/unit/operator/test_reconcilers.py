"""The reconcilers' decisions, from cached state to actions, without an API server."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronlock_operator.cronjob.config import parse_config
from cronlock_operator.cronjob.reading import Readings, counting_settings
from cronlock_operator.injection.build import desired_cronjob
from cronlock_operator.reconcile import cronjobs, expiry, rbac, runs, skips
from cronlock_operator.reconcile.actions import (
    AnnotateCronJob,
    CountRun,
    CountTakeover,
    CountTick,
    DeleteJob,
    DropLeaseOwner,
    EnsureLease,
    MarkJob,
    PatchCronJob,
    PatchLease,
    PostEvent,
    RecordSuccess,
    SetConsecutiveSkips,
    WriteHolderRbac,
)
from cronlock_operator.reconcile.rbac import Guard, HolderGrants
from cronlock_operator.runtime.executor import Executor
from cronlock_operator.runtime.lease_expiry import Observations
from cronlock_sidecar.lock import ticks
from cronlock_sidecar.lock.model import read_lease
from tests.support import gen
from tests.support.cronjobs import SETTINGS, changed
from tests.support.fakekube import FakeKube
from tests.support.leases import make_lease

NAMESPACE = "team-a"


# Report as the API server stores it.
STORED = (gen.with_uid("uid-report"), gen.as_stored())


def injected(body: dict[str, Any]) -> dict[str, Any]:
    return desired_cronjob(body, parse_config(body, SETTINGS), SETTINGS)


def decide(body: dict[str, Any], **state: Any) -> cronjobs.CronJobDecision:
    return cronjobs.decide(cronjobs.CronJobInput(body, **state), SETTINGS, readings=Readings())


def kinds(actions: list[Any]) -> list[str]:
    return [
        f"{type(action).__name__}:{action.reason}"
        if isinstance(action, PostEvent)
        else type(action).__name__
        for action in actions
    ]


# --- CronJobs ---------------------------------------------------------------------------


def test_a_new_guarded_cronjob_gets_its_lease_and_rbac_before_the_patch() -> None:
    decision = decide(gen.cronjob("report", *STORED))
    assert decision.guard == Guard("cronlock-report", "default")
    assert kinds(decision.before) == ["EnsureLease"]
    assert decision.sync_rbac
    assert kinds(decision.after) == ["PatchCronJob", "PostEvent:Injected"]
    ensure = decision.before[0]
    assert isinstance(ensure, EnsureLease)
    assert (ensure.name, ensure.config.lock) == ("cronlock-report", "report")


def test_a_lock_in_a_store_gets_its_lease_as_a_registry_that_no_role_grants() -> None:
    """Security review H1: who uses a store lock, and with whose consent, is kept on a
    Lease as for any lock; its pods never write it, so no holder Role names it."""
    body = gen.cronjob(
        "report",
        gen.annotated(
            {
                "cronlock.io/enabled": "true",
                "cronlock.io/store": "redis",
                "cronlock.io/store-secret": "team-locks",
            }
        ),
        *STORED,
    )
    settings = dataclasses.replace(SETTINGS, sidecar_stores_image="ghcr.io/example/s:1.0.0")
    decision = cronjobs.decide(
        cronjobs.CronJobInput(body),
        settings,
        readings=Readings(),
    )
    assert decision.guard == Guard("cronlock-report", "default", holds=False)
    assert kinds(decision.before) == ["EnsureLease"]
    _, [write] = rbac.decide(NAMESPACE, {decision.guard, Guard("cronlock-x", "ci")}, None)
    assert isinstance(write, WriteHolderRbac)
    assert [role["rules"][0]["resourceNames"] for role in write.roles] == [["cronlock-x"]]


def test_an_injected_cronjob_whose_rbac_is_granted_needs_no_write_but_the_lease_check() -> None:
    body = injected(gen.cronjob("report", *STORED))
    guard = Guard("cronlock-report", "default")
    decision = decide(body, previous=guard, grants=HolderGrants(granted=frozenset({guard})))
    assert decision.after == []
    assert not decision.sync_rbac
    # EnsureLease with the cached Lease sends nothing when that Lease is already as it should be.
    assert kinds(decision.before) == ["EnsureLease"]


def test_changing_the_lock_moves_the_owner_reference() -> None:
    body = injected(gen.cronjob("report", *STORED))
    body["metadata"]["annotations"]["cronlock.io/lock"] = "exports"
    decision = decide(body, previous=Guard("cronlock-report", "default"))
    assert kinds(decision.before) == ["EnsureLease", "DropLeaseOwner"]
    drop = decision.before[1]
    assert isinstance(drop, DropLeaseOwner)
    assert drop.name == "cronlock-report"
    assert decision.guard == Guard("cronlock-exports", "default")


def test_opting_out_reverts_releases_the_lease_and_syncs_rbac() -> None:
    body = injected(gen.cronjob("report", *STORED))
    body["metadata"]["annotations"]["cronlock.io/enabled"] = "false"
    decision = decide(body, previous=Guard("cronlock-report", "default"))
    assert decision.guard is None
    assert kinds(decision.before) == ["DropLeaseOwner"]
    assert decision.sync_rbac
    assert kinds(decision.after) == ["PatchCronJob", "PostEvent:Reverted"]


def test_bad_input_is_one_warning_that_changes_nothing_and_is_not_repeated() -> None:
    body = injected(gen.cronjob("report", *STORED))
    body["metadata"]["annotations"]["cronlock.io/policy"] = "replce"
    decision = decide(body, previous=Guard("cronlock-report", "default"))
    assert decision.keep_guard
    assert kinds(decision.before) == ["PostEvent:InvalidConfig"]
    assert decision.after == []
    assert not decision.sync_rbac
    message = decision.posted["InvalidConfig"]
    assert message is not None
    assert "cronlock.io/policy" in message
    again = decide(body, posted={"InvalidConfig": message})
    assert again.before == []


def test_a_valid_config_forgets_the_earlier_warning() -> None:
    assert decide(gen.cronjob("report", *STORED)).posted["InvalidConfig"] is None


def test_a_ttl_longer_than_the_schedule_gap_is_warned_once() -> None:
    body = gen.cronjob(
        "report", gen.annotated({"cronlock.io/enabled": "true", "cronlock.io/ttl": "10m"}), *STORED
    )
    first = decide(body)
    assert "PostEvent:TTLLongerThanSchedule" in kinds(first.after)
    warning = first.posted["TTLLongerThanSchedule"]
    assert warning is not None
    second = decide(body, posted={"TTLLongerThanSchedule": warning})
    assert "PostEvent:TTLLongerThanSchedule" not in kinds(second.after)


def test_the_pending_guard_names_the_account_the_runs_use() -> None:
    body = gen.cronjob("report", gen.service_account("exporter"), *STORED)
    assert cronjobs.pending_guard(body, SETTINGS, Readings()) == Guard(
        "cronlock-report", "exporter"
    )
    body["metadata"]["annotations"]["cronlock.io/ttl"] = "soon"
    assert cronjobs.pending_guard(changed(body), SETTINGS, Readings()) is None


# --- RBAC -------------------------------------------------------------------------------


def test_rbac_grants_each_account_only_its_own_leases() -> None:
    guards = {Guard("cronlock-a", "ci"), Guard("cronlock-b", "ci"), Guard("cronlock-c", "other")}
    desired, actions = rbac.decide(NAMESPACE, guards, None)
    assert desired == frozenset(guards)
    [write] = actions
    assert isinstance(write, WriteHolderRbac)
    rules = {role["metadata"]["name"]: role["rules"][0] for role in write.roles}
    assert rules["cronlock-holder-ci"]["resourceNames"] == ["cronlock-a", "cronlock-b"]
    assert rules["cronlock-holder-other"]["resourceNames"] == ["cronlock-c"]
    assert all(rule["verbs"] == ["get", "update", "patch"] for rule in rules.values())
    subjects = {b["metadata"]["name"]: b["subjects"] for b in write.bindings}
    assert subjects["cronlock-holder-ci"] == [
        {"kind": "ServiceAccount", "name": "ci", "namespace": NAMESPACE}
    ]


def test_rbac_in_sync_writes_nothing_and_an_empty_namespace_removes_everything() -> None:
    guards = frozenset({Guard("cronlock-a", "ci")})
    assert rbac.decide(NAMESPACE, guards, guards) == (guards, [])
    _, [write] = rbac.decide(NAMESPACE, set(), guards)
    assert isinstance(write, WriteHolderRbac)
    assert (write.roles, write.bindings) == ((), ())


def test_a_long_account_name_gives_a_valid_role_name() -> None:
    name = rbac.holder_role_name("x" * 300)
    assert len(name) == 253
    assert name != rbac.holder_role_name("x" * 299 + "y")


# --- runs -------------------------------------------------------------------------------


def finished_job(name: str, created: str, outcome: str) -> dict[str, Any]:
    """A Job of lock report made from the injected CronJob, ended as `outcome`."""
    ended = {
        "skipped": gen.skipped(NAMESPACE),
        "failed": gen.failed(),
        "succeeded": gen.succeeded(),
    }
    return gen.job(
        name, gen.created_at(created), gen.of_lock("report"), gen.gated(), ended[outcome]
    )


def test_skips_are_counted_in_creation_order_and_alert_at_alert_after() -> None:
    body = gen.cronjob(
        "report",
        gen.annotated({"cronlock.io/enabled": "true", "cronlock.io/alert-after": "2"}),
        *STORED,
    )
    body["metadata"]["annotations"]["cronlock.io/consecutive-skips"] = "1"
    jobs = [
        finished_job("report-29416203", "2026-12-01T00:00:03Z", "skipped"),
        finished_job("report-29416202", "2026-12-01T00:00:02Z", "skipped"),
    ]
    decision = runs.decide(body, jobs, SETTINGS, readings=Readings())
    assert [run.job for run in decision.runs] == ["report-29416202", "report-29416203"]
    first, second = (run.actions for run in decision.runs)
    assert isinstance(first[0], MarkJob)
    assert kinds(first) == [
        "MarkJob",
        "CountTick",
        "CountRun",
        "PostEvent:Skipped",
        "PostEvent:RepeatedSkips",
        "DeleteJob",
    ]
    assert first[1] == CountTick(NAMESPACE, "report", "overlap")
    assert kinds(second)[3:5] == ["PostEvent:Skipped", "PostEvent:RepeatedSkips"]
    skipped = second[3]
    assert isinstance(skipped, PostEvent)
    assert skipped.message.endswith("(3 in a row)")
    assert decision.after == [
        AnnotateCronJob(NAMESPACE, "report", {"cronlock.io/consecutive-skips": "3"}),
        SetConsecutiveSkips(NAMESPACE, "report", 3),
    ]


def test_a_queued_job_marked_timed_out_is_a_skip_in_a_row_and_is_deleted() -> None:
    """policy: queue: the queue reconciler marks a Job queued past its queue-timeout; it
    counts as a skip (RepeatedSkips at alert-after) and is deleted, kept or not."""
    body = gen.cronjob(
        "report",
        gen.annotated(
            {
                "cronlock.io/enabled": "true",
                "cronlock.io/policy": "queue",
                "cronlock.io/alert-after": "2",
                "cronlock.io/keep-skipped-jobs": "true",
            }
        ),
        *STORED,
    )
    body["metadata"]["annotations"]["cronlock.io/consecutive-skips"] = "1"
    queued = gen.job(
        "report-29416203",
        gen.created_at("2026-12-01T00:03:00Z"),
        gen.of_lock("report"),
        gen.gated(),
        gen.with_metadata(annotations={"cronlock.io/queue-timed-out": "queued 5m0s, ..."}),
    )
    queued["spec"]["suspend"] = True
    decision = runs.decide(body, [queued], SETTINGS, readings=Readings())
    (run,) = decision.runs
    assert kinds(run.actions) == [
        "MarkJob",
        "CountTick",
        "CountRun",
        "PostEvent:QueueTimedOut",
        "PostEvent:RepeatedSkips",
        "DeleteJob",
    ]
    assert run.actions[1] == CountTick(NAMESPACE, "report", "overlap")
    warning = run.actions[3]
    assert isinstance(warning, PostEvent)
    assert warning.warning
    assert warning.message.endswith("never ran and was deleted (2 in a row)")
    assert decision.after == [
        AnnotateCronJob(NAMESPACE, "report", {"cronlock.io/consecutive-skips": "2"}),
        SetConsecutiveSkips(NAMESPACE, "report", 2),
    ]
    # The mark on a Job that runs (let go by hand, or forged) makes it no finished run:
    # it is neither counted nor deleted before it ends.
    queued["spec"]["suspend"] = False
    assert skips.outcome(queued) is None


def made_by(body: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
    """`job` with the pod template the CronJob controller copies from the CronJob `body`."""
    job["spec"] = copy.deepcopy(body["spec"]["jobTemplate"]["spec"])
    return job


def test_a_success_resets_the_count_and_a_failure_leaves_it() -> None:
    body = injected(gen.cronjob("report", *STORED))
    body["metadata"]["annotations"]["cronlock.io/consecutive-skips"] = "4"
    decision = runs.decide(
        body,
        [
            made_by(body, finished_job("report-29416201", "2026-12-01T00:00:01Z", "succeeded")),
            made_by(body, finished_job("report-29416202", "2026-12-01T00:00:02Z", "failed")),
        ],
        SETTINGS,
        readings=Readings(),
    )
    # report-29416201 is a tick's name (minute 1 of the epoch): its success is recorded too
    assert [kinds(run.actions) for run in decision.runs] == [
        ["MarkJob", "CountTick", "RecordSuccess"],
        ["MarkJob", "CountTick"],
    ]
    assert {run.actions[1] for run in decision.runs} == {CountTick(NAMESPACE, "report", "worked")}
    assert decision.after == [
        AnnotateCronJob(NAMESPACE, "report", {"cronlock.io/consecutive-skips": None}),
        SetConsecutiveSkips(NAMESPACE, "report", 0),
    ]


def test_a_forged_job_that_never_took_the_lock_does_not_end_a_run_of_skips() -> None:
    """Security review L8: a Job naming the CronJob as its owner, created by anyone who may
    create Jobs, without cronlock's gate (one container `true`) completes: the skips in a
    row stay, so a stuck lock's RepeatedSkips is not hidden."""
    body = gen.cronjob("report", *STORED)
    body["metadata"]["annotations"]["cronlock.io/consecutive-skips"] = "4"
    forged = finished_job("report-29999999", "2026-12-01T00:00:01Z", "succeeded")
    forged["spec"] = {"template": {"spec": {"containers": [{"name": "w", "command": ["true"]}]}}}
    decision = runs.decide(body, [forged], SETTINGS, readings=Readings())
    assert decision.after == [SetConsecutiveSkips(NAMESPACE, "report", 4)]


def _gate_is_true(spec: dict[str, Any]) -> None:
    gate = next(c for c in spec["initContainers"] if c["name"] == "cronlock-gate")
    gate["command"] = ["true"]


def _sidecar_runs_another_image(spec: dict[str, Any]) -> None:
    sidecar = next(c for c in spec["initContainers"] if c["name"] == "cronlock")
    sidecar["image"] = "busybox:1.36"


def _run_dir_from_a_config_map(spec: dict[str, Any]) -> None:
    # A "decision: run" file of the forger's own: the real gate would read it and exit 0.
    for volume in spec["volumes"]:
        if volume["name"] == "cronlock":
            volume.clear()
            volume.update({"name": "cronlock", "configMap": {"name": "decided-run"}})


def _another_lock(spec: dict[str, Any]) -> None:
    sidecar = next(c for c in spec["initContainers"] if c["name"] == "cronlock")
    for env in sidecar["env"]:
        if env["name"] == "CRONLOCK_LEASE":
            env["value"] = f"{NAMESPACE}/cronlock-free-lock"


def _only_a_gate_by_name(spec: dict[str, Any]) -> None:
    spec["initContainers"] = [{"name": "cronlock-gate", "image": "busybox:1.36"}]


@pytest.mark.parametrize(
    "forge",
    [
        _gate_is_true,
        _sidecar_runs_another_image,
        _run_dir_from_a_config_map,
        _another_lock,
        _only_a_gate_by_name,
    ],
)
def test_a_forged_job_with_a_gate_of_its_own_does_not_end_a_run_of_skips(
    forge: Callable[[dict[str, Any]], None],
) -> None:
    """Security review L-N6: a container *named* cronlock-gate proved nothing. A Job owned
    by the CronJob whose cronlock containers or their volumes differ in anything from the
    CronJob's own completes without ending the skips in a row."""
    body = injected(gen.cronjob("report", *STORED))
    body["metadata"]["annotations"]["cronlock.io/consecutive-skips"] = "4"
    forged = made_by(body, finished_job("report-29999999", "2026-12-01T00:00:01Z", "succeeded"))
    forge(forged["spec"]["template"]["spec"])
    decision = runs.decide(body, [forged], SETTINGS, readings=Readings())
    assert decision.after == [SetConsecutiveSkips(NAMESPACE, "report", 4)]
    # The same Job as the CronJob controller makes it does end them.
    real = made_by(body, finished_job("report-29999998", "2026-12-01T00:00:01Z", "succeeded"))
    decision = runs.decide(body, [real], SETTINGS, readings=Readings())
    assert decision.after[-1] == SetConsecutiveSkips(NAMESPACE, "report", 0)


def test_kept_and_gone_skipped_jobs_are_not_deleted() -> None:
    body = gen.cronjob(
        "report",
        gen.annotated({"cronlock.io/enabled": "true", "cronlock.io/keep-skipped-jobs": "true"}),
        *STORED,
    )
    job = finished_job("report-29416201", "2026-12-01T00:00:01Z", "skipped")
    assert (
        DeleteJob(NAMESPACE, "report-29416201")
        not in runs.decide(body, [job], SETTINGS, readings=Readings()).runs[0].actions
    )
    gone = runs.decide(
        gen.cronjob("report", *STORED),
        [job],
        SETTINGS,
        gone=frozenset({"uid-report-29416201"}),
        readings=Readings(),
    )
    assert kinds(gone.runs[0].actions) == ["CountTick", "CountRun", "PostEvent:Skipped"]


def test_only_skipped_and_replaced_jobs_are_labelled_with_their_outcome() -> None:
    """What KubeJobFailed's exclusion reads: the Failed Jobs that are cronlock's doing."""
    body = gen.cronjob(
        "report",
        gen.annotated({"cronlock.io/enabled": "true", "cronlock.io/keep-skipped-jobs": "true"}),
        *STORED,
    )
    jobs = [
        finished_job("report-29416201", "2026-12-01T00:00:01Z", "skipped"),
        finished_job("report-29416202", "2026-12-01T00:00:02Z", "failed"),
        finished_job("report-29416203", "2026-12-01T00:00:03Z", "failed"),
        finished_job("report-29416204", "2026-12-01T00:00:04Z", "succeeded"),
    ]
    decision = runs.decide(
        body, jobs, SETTINGS, contended={"report-29416203": "replaced"}, readings=Readings()
    )
    marks = [run.actions[0] for run in decision.runs]
    assert marks == [
        MarkJob(NAMESPACE, "report-29416201", "cronlock.io/accounted", "skipped", "skipped"),
        MarkJob(NAMESPACE, "report-29416202", "cronlock.io/accounted", "failed", None),
        MarkJob(NAMESPACE, "report-29416203", "cronlock.io/accounted", "replaced", "replaced"),
        MarkJob(NAMESPACE, "report-29416204", "cronlock.io/accounted", "succeeded", None),
    ]
    kube = FakeKube()
    for job in jobs:
        kube.jobs[(NAMESPACE, job["metadata"]["name"])] = job
    executor = Executor(kube)
    for mark in marks:
        executor.run([mark])
    labels = {name: job["metadata"]["labels"] for (_, name), job in kube.jobs.items()}
    assert labels["report-29416201"]["cronlock.io/outcome"] == "skipped"
    assert labels["report-29416203"]["cronlock.io/outcome"] == "replaced"
    assert "cronlock.io/outcome" not in labels["report-29416202"] | labels["report-29416204"]


def test_a_skip_that_ended_while_its_lock_was_frozen_is_a_frozen_event_not_a_skip() -> None:
    body = gen.cronjob(
        "report",
        gen.annotated({"cronlock.io/enabled": "true", "cronlock.io/alert-after": "1"}),
        *STORED,
    )
    during = finished_job("report-29416201", "2026-12-01T00:00:01Z", "skipped")
    during["status"]["conditions"][0]["lastTransitionTime"] = "2026-12-01T00:00:05Z"
    after = finished_job("report-29416202", "2026-12-01T03:00:01Z", "skipped")
    after["status"]["conditions"][0]["lastTransitionTime"] = "2026-12-01T03:00:05Z"
    freeze = runs.FrozenLock(datetime(2026, 12, 1, 2, 0, tzinfo=UTC), "alice", "DB migration")
    decision = runs.decide(
        body, [during, after], SETTINGS, frozen={"report": freeze}, readings=Readings()
    )
    first, second = (run.actions for run in decision.runs)
    assert kinds(first) == ["MarkJob", "CountTick", "CountRun", "PostEvent:Frozen", "DeleteJob"]
    assert first[1] == CountTick(NAMESPACE, "report", "frozen")
    frozen_event = first[3]
    assert isinstance(frozen_event, PostEvent)
    assert frozen_event.message == (
        "run report-29416201 skipped: lock report frozen until 2026-12-01T02:00:00.000000Z "
        "by alice: DB migration"
    )
    # After the freeze ended, a skip is a skip again, and the first in a row.
    assert kinds(second)[:4] == ["MarkJob", "CountTick", "CountRun", "PostEvent:Skipped"]
    assert decision.after[0] == AnnotateCronJob(
        NAMESPACE, "report", {"cronlock.io/consecutive-skips": "1"}
    )


ALREADY_RAN_LINE = (
    "already ran: tick 2026-12-01T00:00:00Z of report on lock report was claimed by job "
    "report-29416320 (run uid-a, holder pod-a, cluster east) for tick 2026-12-01T00:00:00Z; "
    "skipping this run"
)


def test_a_skip_whose_gate_said_already_ran_is_its_own_event_and_no_skip_in_a_row() -> None:
    """Issue 56: the tick was worked by another run; no lock is stuck, so RepeatedSkips
    keeps its meaning. A skip of the lock held stays a Skipped one in the same list."""
    body = injected(
        gen.cronjob(
            "report",
            gen.annotated({"cronlock.io/enabled": "true", "cronlock.io/alert-after": "2"}),
            *STORED,
        )
    )
    body["metadata"]["annotations"]["cronlock.io/consecutive-skips"] = "1"
    jobs = [
        made_by(body, finished_job("report-29416320", "2026-12-01T00:00:01Z", "skipped")),
        made_by(body, finished_job("report-29416321", "2026-12-01T00:01:01Z", "skipped")),
    ]
    decision = runs.decide(
        body, jobs, SETTINGS, already_ran={"report-29416320": ALREADY_RAN_LINE}, readings=Readings()
    )
    first, second = (run.actions for run in decision.runs)
    assert kinds(first) == [
        "MarkJob",
        "CountTick",
        "CountRun",
        "PostEvent:TickAlreadyRan",
        "DeleteJob",
    ]
    assert first[0] == MarkJob(
        NAMESPACE, "report-29416320", "cronlock.io/accounted", "already_ran", "skipped"
    )
    assert first[2] == CountRun("already_ran")
    event = first[3]
    assert isinstance(event, PostEvent)
    assert not event.warning
    assert event.message == f"run report-29416320: {ALREADY_RAN_LINE}"
    assert first[1] == CountTick(NAMESPACE, "report", "already_ran")
    # The held-lock skip after it is the second in a row, not the third.
    skipped = second[3]
    assert isinstance(skipped, PostEvent)
    assert skipped.message.endswith("(2 in a row)")
    assert second[1] == CountTick(NAMESPACE, "report", "overlap")
    assert decision.after[0] == AnnotateCronJob(
        NAMESPACE, "report", {"cronlock.io/consecutive-skips": "2"}
    )


def test_already_ran_runs_alone_leave_the_skips_in_a_row_as_they_were() -> None:
    body = injected(
        gen.cronjob(
            "report",
            gen.annotated({"cronlock.io/enabled": "true", "cronlock.io/alert-after": "1"}),
            *STORED,
        )
    )
    body["metadata"]["annotations"]["cronlock.io/consecutive-skips"] = "3"
    job = made_by(body, finished_job("report-29416320", "2026-12-01T00:00:01Z", "skipped"))
    decision = runs.decide(
        body, [job], SETTINGS, already_ran={"report-29416320": "x"}, readings=Readings()
    )
    assert "PostEvent:RepeatedSkips" not in kinds(decision.runs[0].actions)
    assert decision.after == [SetConsecutiveSkips(NAMESPACE, "report", 3)]


@pytest.mark.parametrize(
    "forge",
    [_gate_is_true, _sidecar_runs_another_image, _run_dir_from_a_config_map, _another_lock],
)
def test_a_forged_jobs_gate_saying_already_ran_is_a_plain_skip(
    forge: Callable[[dict[str, Any]], None],
) -> None:
    """A forger's gate may print `already ran` and exit 75: its Job's cronlock containers
    are not the CronJob's, so its word is not taken; a skip in a row, as before."""
    body = injected(
        gen.cronjob(
            "report",
            gen.annotated({"cronlock.io/enabled": "true", "cronlock.io/alert-after": "5"}),
            *STORED,
        )
    )
    forged = made_by(body, finished_job("report-29416320", "2026-12-01T00:00:01Z", "skipped"))
    forge(forged["spec"]["template"]["spec"])
    decision = runs.decide(
        body, [forged], SETTINGS, already_ran={"report-29416320": "x"}, readings=Readings()
    )
    assert "PostEvent:TickAlreadyRan" not in kinds(decision.runs[0].actions)
    assert "PostEvent:Skipped" in kinds(decision.runs[0].actions)
    assert decision.after[-1] == SetConsecutiveSkips(NAMESPACE, "report", 1)


def test_a_line_for_a_job_that_did_not_skip_changes_nothing() -> None:
    """Only a skipped Job's gate can have said it: a line for a Job that succeeded or
    failed is ignored (the runtime reads lines only for skipped Jobs)."""
    body = injected(gen.cronjob("report", *STORED))
    job = made_by(body, finished_job("report-29416320", "2026-12-01T00:00:01Z", "succeeded"))
    decision = runs.decide(
        body, [job], SETTINGS, already_ran={"report-29416320": "x"}, readings=Readings()
    )
    assert kinds(decision.runs[0].actions) == ["MarkJob", "CountTick", "RecordSuccess"]
    assert decision.runs[0].actions[1] == CountTick(NAMESPACE, "report", "worked")


def test_ticks_count_only_runs_of_a_tick_and_only_runs_that_prove_something() -> None:
    """A manual run (`kubectl create job --from`) is no tick; a Job that never took the
    lock (security review L8) worked no tick; an observed overlap or a replaced run did."""
    body = injected(gen.cronjob("report", *STORED))
    manual = made_by(body, finished_job("report-manual-x1", "2026-12-01T00:00:01Z", "succeeded"))
    manual_skip = finished_job("report-manual-x2", "2026-12-01T00:00:02Z", "skipped")
    forged = finished_job("report-29416322", "2026-12-01T00:00:03Z", "succeeded")
    forged["spec"] = {"template": {"spec": {"containers": [{"name": "w", "command": ["true"]}]}}}
    observed = finished_job("report-29416323", "2026-12-01T00:00:04Z", "succeeded")
    replaced = finished_job("report-29416324", "2026-12-01T00:00:05Z", "failed")
    failed = made_by(body, finished_job("report-29416325", "2026-12-01T00:00:06Z", "failed"))
    decision = runs.decide(
        body,
        [manual, manual_skip, forged, observed, replaced, failed],
        SETTINGS,
        contended={"report-29416323": "overlapped", "report-29416324": "replaced"},
        readings=Readings(),
    )
    counted = {
        run.job: [action.outcome for action in run.actions if isinstance(action, CountTick)]
        for run in decision.runs
    }
    assert counted == {
        "report-manual-x1": [],
        "report-manual-x2": [],
        "report-29416322": [],
        "report-29416323": ["worked"],
        "report-29416324": ["worked"],
        "report-29416325": ["worked"],
    }


TICK_AT = datetime.fromtimestamp(29416320 * 60, UTC)


def test_a_ticks_job_that_succeeded_through_a_lease_lock_records_its_success_last() -> None:
    body = injected(gen.cronjob("report", *STORED))
    tick = made_by(body, finished_job("report-29416320", "2026-12-01T00:00:01Z", "succeeded"))
    failed = made_by(body, finished_job("report-29416321", "2026-12-01T00:00:02Z", "failed"))
    manual = made_by(body, finished_job("report-manual-x1", "2026-12-01T00:00:03Z", "succeeded"))
    forged = finished_job("report-29416322", "2026-12-01T00:00:04Z", "succeeded")
    forged["spec"] = {"template": {"spec": {"containers": [{"name": "w", "command": ["true"]}]}}}
    decision = runs.decide(body, [tick, failed, manual, forged], SETTINGS, readings=Readings())
    recorded = {
        run.job: [action for action in run.actions if isinstance(action, RecordSuccess)]
        for run in decision.runs
    }
    assert recorded == {
        "report-29416320": [
            RecordSuccess(
                NAMESPACE,
                "cronlock-report",
                "report",
                TICK_AT,
                "uid-report-29416320",
                SETTINGS.skew_seconds,
            )
        ],
        "report-29416321": [],
        "report-manual-x1": [],
        "report-29416322": [],
    }
    assert isinstance(decision.runs[0].actions[-1], RecordSuccess)


def test_a_store_locks_success_is_not_the_operators_to_record() -> None:
    settings = dataclasses.replace(SETTINGS, sidecar_stores_image="ghcr.io/example/s:1.0.0")
    body = gen.cronjob(
        "report",
        gen.annotated({"cronlock.io/store": "redis", "cronlock.io/store-secret": "cronlock-redis"}),
        *STORED,
    )
    body = desired_cronjob(body, parse_config(body, settings), settings)
    tick = made_by(body, finished_job("report-29416320", "2026-12-01T00:00:01Z", "succeeded"))
    [run] = runs.decide(body, [tick], settings, readings=Readings()).runs
    assert "CountTick" in kinds(run.actions)
    assert "RecordSuccess" not in kinds(run.actions)


def claimed_by(run: str, at: datetime = TICK_AT, success: datetime | None = None) -> dict[str, Any]:
    claim = ticks.TickRecord("report", at, f"report-{int(at.timestamp()) // 60}", run, "p_1", "")
    notes = ticks.with_record({}, claim)
    if success is not None:
        notes = ticks.with_record(notes, claim._replace(at=success), "cronlock.io/succeeded.")
    return make_lease(namespace=NAMESPACE, annotations=notes, resource_version="7")


def success_on(kube: FakeKube) -> ticks.TickRecord | None:
    stored = kube.leases[(NAMESPACE, "cronlock-report")]
    return ticks.read_success(stored["metadata"].get("annotations") or {}, "report")


def test_the_executor_records_the_success_on_the_lease_as_read_at_the_write() -> None:
    action = RecordSuccess(NAMESPACE, "cronlock-report", "report", TICK_AT, "uid-a", 2)
    kube = FakeKube(leases=[claimed_by("uid-a")])
    assert Executor(kube).run([action]).completed
    success = success_on(kube)
    assert success is not None
    assert (success.at, success.run) == (TICK_AT, "uid-a")
    # a later claim took the record meanwhile: nothing to write, nothing else stopped
    later = TICK_AT + timedelta(minutes=1)
    kube = FakeKube(leases=[claimed_by("uid-b", later)])
    assert Executor(kube).run([action]).completed
    assert success_on(kube) is None
    assert [call for call, *_ in kube.calls] == ["read_lease"]
    # a success as new is recorded: nothing moves
    kube = FakeKube(leases=[claimed_by("uid-a", success=TICK_AT)])
    assert Executor(kube).run([action]).completed
    assert "patch_lease" not in [call for call, *_ in kube.calls]
    # the Lease is gone (a store lock, or deleted): nothing to write
    assert Executor(FakeKube()).run([action]).gone


# --- Lease expiry -----------------------------------------------------------------------


RENEWED = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def lease(
    holder: str, renewed: datetime = RENEWED, transitions: int | None = None, duration: int = 30
) -> dict[str, Any]:
    """Lock report's Lease claimed at RENEWED by `holder`, a pod of Job report-29416201 (released
    by now if ""), last renewed at `renewed`, as the API server returns it at version 7."""
    return make_lease(
        holder,
        namespace=NAMESPACE,
        acquired=RENEWED,
        renewed=renewed,
        duration=duration,
        transitions=transitions,
        job="report-29416201" if holder else "",
        resource_version="7",
    )


LONGEST = 3600  # the longest lease duration the Lease's owners give it


def test_a_hold_is_believed_only_for_the_longest_duration_its_owners_give_it() -> None:
    """A pod on the account writes leaseDurationSeconds 2147483647 (68 years) and dies: the
    operator clears it like any hold of its lock (security review N3)."""
    squatted = lease("intruder", duration=2147483647)
    seen, _ = expiry.observe(None, read_lease(squatted), 100.0, 60)
    assert seen is not None
    assert seen.duration == 60
    assert not seen.overdue(162.0, 2)
    assert seen.overdue(162.5, 2)
    # A shorter duration than the owners' is the holder's own and is kept.
    short, _ = expiry.observe(None, read_lease(lease("a")), 100.0, 60)
    assert short is not None
    assert short.duration == 30


def test_observing_a_new_holder_counts_an_acquired_run_and_a_cleared_one_a_release() -> None:
    first, counts = expiry.observe(None, read_lease(lease("a")), 100.0, LONGEST)
    assert first is not None
    assert counts == []
    same, counts = expiry.observe(first, read_lease(lease("a")), 150.0, LONGEST)
    assert same is None
    assert counts == []
    second, counts = expiry.observe(first, read_lease(lease("b", transitions=2)), 160.0, LONGEST)
    assert second is not None
    assert counts == [CountRun("acquired")]
    free = read_lease(lease("", transitions=2))
    _, counts = expiry.observe(second, free, 170.0, LONGEST)
    assert counts == [CountRun("released")]


def test_observations_list_overdue_only_the_held_leases_past_duration_plus_skew() -> None:
    observations = Observations()
    held, _ = expiry.observe(None, read_lease(lease("a")), 100.0, LONGEST)
    free, _ = expiry.observe(None, read_lease(lease("")), 0.0, LONGEST)
    assert held is not None
    assert free is not None
    observations.put((NAMESPACE, "held"), held)
    observations.put((NAMESPACE, "free"), free)
    assert list(observations.overdue(132.0, 2)) == []
    assert list(observations.overdue(132.1, 2)) == [(NAMESPACE, "held")]
    # Released: no longer held, so no longer checked; forgotten: gone altogether.
    observations.put((NAMESPACE, "held"), free)
    assert list(observations.overdue(1000.0, 2)) == []
    observations.forget((NAMESPACE, "held"))
    assert observations.get((NAMESPACE, "held")) is None
    assert observations.get((NAMESPACE, "free")) == free


def test_a_holder_is_overdue_only_past_its_duration_plus_the_skew() -> None:
    seen, _ = expiry.observe(None, read_lease(lease("a")), 100.0, LONGEST)
    assert seen is not None
    assert not seen.overdue(132.0, 2)
    assert seen.overdue(132.5, 2)


def test_an_overdue_holder_is_cleared_with_a_guarded_patch_then_the_owners_are_told() -> None:
    seen, _ = expiry.observe(None, read_lease(lease("a")), 100.0, LONGEST)
    assert seen is not None
    owner = gen.cronjob("report", *STORED)
    wall = datetime(2026, 12, 1, 12, 1, 0, tzinfo=UTC)
    actions = expiry.decide(seen, lease("a"), [owner], 140.0, wall)
    assert kinds(actions) == ["PatchLease", "CountTakeover", "CountRun", "PostEvent:LeaseExpired"]
    patch = actions[0]
    assert isinstance(patch, PatchLease)
    assert patch.patch[:3] == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "test", "path": "/spec/holderIdentity", "value": "a"},
        {"op": "remove", "path": "/spec/holderIdentity"},
    ]
    assert patch.patch[3]["value"]["cronlock.io/last-holder"] == "a"
    assert actions[1:3] == [CountTakeover(NAMESPACE, "report", "expired"), CountRun("lost")]
    event = actions[3]
    assert isinstance(event, PostEvent)
    assert "not renewed for 40s" in event.message


def test_a_holder_that_renewed_meanwhile_is_left_alone() -> None:
    seen, _ = expiry.observe(None, read_lease(lease("a")), 100.0, LONGEST)
    assert seen is not None
    later = datetime(2026, 12, 1, 12, 0, 10, tzinfo=UTC)
    wall = datetime(2026, 12, 1, 12, 1, 0, tzinfo=UTC)
    assert expiry.decide(seen, lease("a", later), [], 140.0, wall) == []
    assert expiry.decide(seen, lease("b"), [], 140.0, wall) == []


def test_the_executor_drops_what_follows_a_write_whose_object_is_gone() -> None:
    kube = FakeKube()  # holds no CronJob: the patch answers "gone"
    executor = Executor(kube)
    body = gen.cronjob("report", *STORED)
    done = executor.run(
        [
            PostEvent(body, "A", "a"),
            PatchCronJob(NAMESPACE, "report", []),
            PostEvent(body, "B", "b"),
        ]
    )
    assert done.gone
    # No Event claims an injection that did not happen.
    assert [call for call, _ in kube.calls] == ["post_event", "patch_cronjob"]


def test_an_unrelated_invalid_annotation_keeps_the_users_counting_settings() -> None:
    """keep-skipped-jobs and alert-after hold even when another annotation is invalid (the
    operator deleted the Jobs the user asked to keep, and alerted after 3 instead of 2)."""
    body = gen.cronjob(
        "report",
        gen.annotated(
            {
                "cronlock.io/enabled": "true",
                "cronlock.io/keep-skipped-jobs": "true",
                "cronlock.io/alert-after": "2",
                "cronlock.io/ttl": "soon",  # invalid: the CronJob is left as it was
            }
        ),
        *STORED,
    )
    changed(body)["metadata"]["annotations"]["cronlock.io/consecutive-skips"] = "1"
    job = finished_job("report-29416202", "2026-12-01T00:00:02Z", "skipped")
    [run] = runs.decide(body, [job], SETTINGS, readings=Readings()).runs
    assert "DeleteJob" not in kinds(run.actions)
    assert "PostEvent:RepeatedSkips" in kinds(run.actions)
    assert counting_settings(body, SETTINGS, Readings()) == (2, True)
    # Invalid themselves, each falls back to its own default only.
    body["metadata"]["annotations"]["cronlock.io/keep-skipped-jobs"] = "yes"
    changed(body)
    assert counting_settings(body, SETTINGS, Readings()) == (2, False)


def test_a_hold_seen_before_its_owners_is_capped_once_their_ttl_is_known() -> None:
    """Security review L1: at start-up a day-long hold seen before its CronJob's reconcile
    was believed for a day; once the owner's ttl is known it is believed only that long."""
    observations = Observations()
    squatted, _ = expiry.observe(None, read_lease(lease("x", duration=86400)), 100.0, 86400)
    assert squatted is not None
    observations.put((NAMESPACE, "cronlock-report"), squatted)
    assert list(observations.overdue(100.0 + 3600, 2)) == []
    observations.cap((NAMESPACE, "cronlock-report"), 60)
    assert list(observations.overdue(162.0, 2)) == []
    assert list(observations.overdue(162.5, 2)) == [(NAMESPACE, "cronlock-report")]
    # A shorter hold stays its own.
    observations.cap((NAMESPACE, "cronlock-report"), 3600)
    assert list(observations.overdue(162.5, 2)) == [(NAMESPACE, "cronlock-report")]


def test_decide_reads_the_lease_and_its_users_only_from_what_was_gathered() -> None:
    """Issue 57 item 2: `decide` takes one gathered value (`CronJobInput`), no lookups; the
    Lease's other users it was given are what joining asks consent of, and the runtime
    gathers exactly the Lease `lease_needed` names and the users `users_of` it names."""
    body = gen.cronjob("report", *STORED)
    lease = make_lease(namespace=NAMESPACE, owners=[("export", "uid-export")])
    export = gen.cronjob("export", gen.with_uid("uid-export"))
    assert cronjobs.lease_needed(body, SETTINGS, Readings()) == "cronlock-report"
    assert cronjobs.users_of(lease) == ["export"]
    assert cronjobs.users_of(None) == []
    assert cronjobs.lease_needed(gen.cronjob("off", gen.not_opted_in()), SETTINGS, Readings()) == ""
    decision = decide(body, lease=lease, users={"export": export})
    [ensure] = [action for action in decision.before if isinstance(action, EnsureLease)]
    assert ensure.cached is lease
    assert dict(ensure.users) == {"export": export}
    # Nothing gathered: nothing seen, and nobody's consent is assumed.
    [alone] = [action for action in decide(body).before if isinstance(action, EnsureLease)]
    assert (alone.cached, dict(alone.users)) == (None, {})


def test_pending_guards_read_the_gathered_leases_and_the_namespaces_own_cronjobs() -> None:
    """A burst's guards, granted ahead of their reconcile: a Lease another CronJob uses
    is granted only with that user's consent, read from the namespace's CronJobs given."""
    lock = {"cronlock.io/enabled": "true", "cronlock.io/lock": "ledger"}
    report = gen.cronjob(
        "report", gen.with_annotations(lock), gen.service_account("reporter"), *STORED
    )
    lease = make_lease(lock="ledger", namespace=NAMESPACE, owners=[("export", "uid-export")])
    leases = {"cronlock-ledger": lease}
    silent = gen.cronjob("export", gen.with_annotations(lock), gen.with_uid("uid-export"))
    consenting = gen.cronjob(
        "export",
        gen.with_annotations({**lock, "cronlock.io/share-lock-with": "report"}),
        gen.with_uid("uid-export"),
    )

    def pending(*bodies: dict[str, Any], given: dict[str, Any]) -> set[Guard]:
        return cronjobs.pending_guards(
            bodies, SETTINGS, refused=(), leases=given, readings=Readings()
        )

    reporter, exporter = Guard("cronlock-ledger", "reporter"), Guard("cronlock-ledger", "default")
    assert pending(report, silent, given=leases) == {exporter}, "no consent from export"
    assert pending(report, given=leases) == set(), "its user unseen: no consent"
    assert pending(report, given={}) == {reporter}, "no Lease seen: it would be created"
    assert pending(report, consenting, given=leases) == {reporter, exporter}
