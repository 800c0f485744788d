"""Run accounting: every finished run is counted exactly once, even when its Job is deleted
before the operator gets to it (the CronJob controller keeps one failed Job by default)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from cronlock_operator.cronjob.config import parse_config
from cronlock_operator.cronjob.reading import Readings
from cronlock_operator.injection.build import desired_cronjob
from cronlock_operator.kube.cache import ObjectCache
from cronlock_operator.kube.errors import Retry
from cronlock_operator.reconcile import contention, skips
from cronlock_operator.reconcile.keys import ContentionKey, RunsKey
from cronlock_operator.runtime import accounting as accounting_module
from cronlock_operator.runtime import metrics
from cronlock_operator.runtime.accounting import RunAccounting
from cronlock_operator.runtime.executor import Executor
from cronlock_operator.runtime.reconciler import Reconciler
from cronlock_sidecar.lock.model import read_lease
from tests.support import gen
from tests.support.cronjobs import SETTINGS
from tests.support.fakekube import FakeKube
from tests.support.leases import MOMENT, make_lease

NAMESPACE = "team-a"


class RecordingKube(FakeKube):
    """The in-memory API server holding the CronJob `report` and the Jobs that arrive."""

    def __init__(self, cronjob: dict[str, Any]) -> None:
        super().__init__(cronjobs=[cronjob])

    @property
    def cronjob(self) -> dict[str, Any]:
        return self.cronjobs[(NAMESPACE, "report")]

    @property
    def deleted(self) -> list[str]:
        return [name for _, name in self.called("delete_job")]

    def said(self) -> list[tuple[str, str]]:
        """Each Event posted, as (reason, message)."""
        return [(reason, message) for _, reason, message, _ in self.events]

    def fail_marks(self, times: int) -> None:
        """The next `times` Job marks meet a reset connection."""
        left = [times]

        def reset(*args: Any) -> BaseException | None:
            left[0] -= 1
            return OSError("connection reset") if left[0] >= 0 else None

        self.fail["mark_job"] = reset


def finished_job(name: str, created: str, skipped: bool = True) -> dict[str, Any]:
    """A Job of CronJob report (lock report) made injected, skipped or else succeeded."""
    return gen.job(
        name,
        gen.in_namespace(NAMESPACE),
        gen.created_at(created),
        gen.of_lock("report"),
        gen.owned_by("report", "cj"),
        gen.gated(),
        gen.skipped(NAMESPACE) if skipped else gen.succeeded(),
    )


@pytest.fixture
def setup() -> tuple[Reconciler, RecordingKube]:
    cronjob = gen.cronjob("report", gen.in_namespace(NAMESPACE), gen.with_uid("cj"))
    kube = RecordingKube(cronjob)
    return Reconciler(kube=kube, settings=SETTINGS), kube


def arrive(reconciler: Reconciler, kube: RecordingKube, job: dict[str, Any]) -> None:
    kube.jobs[(NAMESPACE, job["metadata"]["name"])] = copy.deepcopy(job)
    reconciler.on_job("ADDED", job)


def skipped_events(kube: RecordingKube) -> list[str]:
    return [message for reason, message in kube.said() if reason == "Skipped"]


def test_a_skipped_job_deleted_before_it_was_counted_is_still_counted(
    setup: tuple[Reconciler, RecordingKube],
) -> None:
    reconciler, kube = setup
    first = finished_job("report-1", "2026-12-01T00:00:01Z")
    second = finished_job("report-2", "2026-12-01T00:00:02Z")
    arrive(reconciler, kube, first)
    arrive(reconciler, kube, second)
    # The CronJob controller deletes the older failed Job before the operator's turn.
    del kube.jobs[(NAMESPACE, "report-1")]
    reconciler.on_job("DELETED", first)

    reconciler.accounting.account_runs(RunsKey(NAMESPACE, "report"))

    assert skipped_events(kube) == [
        "run report-1 skipped: lock report was held by another run (1 in a row)",
        "run report-2 skipped: lock report was held by another run (2 in a row)",
    ]
    assert kube.deleted == ["report-2"]  # the gone one is not deleted again
    assert kube.cronjob["metadata"]["annotations"]["cronlock.io/consecutive-skips"] == "2"


def test_the_run_accounting_built_alone_counts_a_skipped_run_once() -> None:
    """One reconciler per kind: RunAccounting needs no router, only the caches it reads,
    `Kube` and the executor; `job_seen` says which key is due, `account_runs` counts."""
    cronjob = gen.cronjob("report", gen.in_namespace(NAMESPACE), gen.with_uid("cj"))
    kube = RecordingKube(cronjob)
    cronjobs, jobs = ObjectCache(), ObjectCache()
    cronjobs.put(copy.deepcopy(cronjob))
    accounting = RunAccounting(
        kube,
        SETTINGS,
        Executor(kube),
        cronjobs=cronjobs,
        jobs=jobs,
        leases=ObjectCache(),
        readings=Readings(),
    )
    job = finished_job("report-1", "2026-12-01T00:00:01Z")
    kube.jobs[(NAMESPACE, "report-1")] = copy.deepcopy(job)
    jobs.put(job)
    assert accounting.job_seen(job) == "report"
    for _ in range(2):
        accounting.account_runs(RunsKey(NAMESPACE, "report"))
    assert skipped_events(kube) == [
        "run report-1 skipped: lock report was held by another run (1 in a row)"
    ]


def test_replayed_and_late_events_count_nothing_twice(
    setup: tuple[Reconciler, RecordingKube],
) -> None:
    reconciler, kube = setup
    job = finished_job("report-1", "2026-12-01T00:00:01Z")
    arrive(reconciler, kube, job)
    reconciler.accounting.account_runs(RunsKey(NAMESPACE, "report"))
    # The watch has not yet shown the mark (the cache holds the unmarked Job) when the
    # next accounting runs, and then the Job's deletion arrives without the mark.
    reconciler.accounting.account_runs(RunsKey(NAMESPACE, "report"))
    reconciler.on_job("DELETED", finished_job("report-1", "2026-12-01T00:00:01Z"))
    reconciler.accounting.account_runs(RunsKey(NAMESPACE, "report"))

    assert len(skipped_events(kube)) == 1
    assert reconciler.accounting.accounted == set()
    assert reconciler.accounting.departed == {}


def test_a_run_whose_mark_failed_is_counted_by_the_retry(
    setup: tuple[Reconciler, RecordingKube],
) -> None:
    reconciler, kube = setup
    arrive(reconciler, kube, finished_job("report-1", "2026-12-01T00:00:01Z"))
    kube.fail_marks(1)
    with pytest.raises(OSError, match="connection reset"):
        reconciler.accounting.account_runs(RunsKey(NAMESPACE, "report"))
    assert skipped_events(kube) == []

    reconciler.accounting.account_runs(RunsKey(NAMESPACE, "report"))
    assert len(skipped_events(kube)) == 1


def test_a_success_resets_the_count_in_creation_order(
    setup: tuple[Reconciler, RecordingKube],
) -> None:
    reconciler, kube = setup
    # The CronJob as the operator injected it; its Jobs carry its template, as the CronJob
    # controller copies it (the success's gate is the CronJob's own, not a forger's).
    cronjob = kube.cronjob
    cronjob["spec"] = desired_cronjob(cronjob, parse_config(cronjob, SETTINGS), SETTINGS)["spec"]
    for number, skipped in ((3, True), (1, True), (2, False)):
        job = finished_job(f"report-{number}", f"2026-12-01T00:00:0{number}Z", skipped)
        job["spec"] = copy.deepcopy(cronjob["spec"]["jobTemplate"]["spec"])
        arrive(reconciler, kube, job)
        if number == 1:
            del kube.jobs[(NAMESPACE, "report-1")]
            reconciler.on_job("DELETED", job)

    reconciler.accounting.account_runs(RunsKey(NAMESPACE, "report"))

    assert skipped_events(kube) == [
        "run report-1 skipped: lock report was held by another run (1 in a row)",
        "run report-3 skipped: lock report was held by another run (1 in a row)",
    ]
    assert skips.consecutive_skips(kube.cronjob) == 1


# --- the replace and observe policies' notes on the Lease (contention.py) ----------------
OLD = "report-1-aaaaa_11111111"
NEW = "report-2-bbbbb_22222222"


def running_job(name: str, created: str) -> dict[str, Any]:
    job = finished_job(name, created)
    job["status"] = {"active": 1}
    return job


def lease_with(holder: str, **notes: str) -> dict[str, Any]:
    """Lock report's Lease held by `holder` (released by now if ""), with the contender
    notes `notes` (`replaced_by=...` is the annotation `cronlock.io/replaced-by`)."""
    annotations = {f"cronlock.io/{key.replace('_', '-')}": value for key, value in notes.items()}
    return make_lease(holder, namespace=NAMESPACE, acquired=MOMENT, annotations=annotations)


def told(reconciler: Reconciler, kube: RecordingKube, lease: dict[str, Any]) -> None:
    reconciler.on_lease("MODIFIED", lease)
    reconciler.accounting.tell_contention(ContentionKey(NAMESPACE, "cronlock-report"))


@pytest.fixture
def guarded(setup: tuple[Reconciler, RecordingKube]) -> tuple[Reconciler, RecordingKube]:
    reconciler, kube = setup
    reconciler.cronjobs.put(kube.cronjob)
    return reconciler, kube


def test_an_overlap_is_told_once_marked_on_its_job_and_counted_like_a_skip(
    guarded: tuple[Reconciler, RecordingKube],
) -> None:
    reconciler, kube = guarded
    overlaps = metrics.registry.get_sample_value("cronlock_overlaps_total") or 0.0
    arrive(reconciler, kube, running_job("report-2", "2026-12-01T00:00:02Z"))
    told(reconciler, kube, lease_with(OLD, overlap=NEW))
    told(reconciler, kube, lease_with(OLD, overlap=NEW))  # a replay, or a renewal since
    assert metrics.registry.get_sample_value("cronlock_overlaps_total") == overlaps + 1
    assert kube.said() == [
        (
            "Overlap",
            f"run report-2 started while lease {NAMESPACE}/cronlock-report was held by {OLD} "
            "(observe policy: it ran anyway; under skip it would have been skipped)",
        )
    ]
    assert (
        kube.jobs[(NAMESPACE, "report-2")]["metadata"]["annotations"]["cronlock.io/overlapped"]
        == OLD
    )

    done = finished_job("report-2", "2026-12-01T00:00:02Z", skipped=False)
    done["metadata"]["annotations"] = kube.jobs[(NAMESPACE, "report-2")]["metadata"]["annotations"]
    arrive(reconciler, kube, done)
    reconciler.accounting.account_runs(RunsKey(NAMESPACE, "report"))
    assert skips.consecutive_skips(kube.cronjob) == 1  # a success, but skip would have skipped
    assert skipped_events(kube) == []
    assert kube.deleted == []  # the run did its work: its Job stays


def test_an_overlapped_run_that_finished_before_it_was_told_still_counts(
    guarded: tuple[Reconciler, RecordingKube],
) -> None:
    reconciler, kube = guarded
    for number in (1, 2, 3):
        name = f"report-{number}"
        arrive(reconciler, kube, finished_job(name, f"2026-12-01T00:00:0{number}Z", False))
        reconciler.on_lease("MODIFIED", lease_with(OLD, overlap=f"{name}-ccccc_3333333{number}"))
        reconciler.accounting.account_runs(
            RunsKey(NAMESPACE, "report")
        )  # before tell_contention ran
    assert skips.consecutive_skips(kube.cronjob) == 3
    [warning] = [message for reason, message in kube.said() if reason == "RepeatedSkips"]
    assert warning.startswith("3 runs in a row overlapped a run holding lock report")


def test_a_replaced_run_is_told_and_neither_counts_as_a_skip_nor_is_deleted(
    guarded: tuple[Reconciler, RecordingKube],
) -> None:
    reconciler, kube = guarded
    replacements = metrics.registry.get_sample_value("cronlock_replacements_total") or 0.0
    arrive(reconciler, kube, running_job("report-1", "2026-12-01T00:00:01Z"))
    # The old holder yielded and released; the replacing run took the Lease.
    told(reconciler, kube, lease_with("", replaced_by=NEW, replaced_jobs="report-1"))
    told(reconciler, kube, lease_with(NEW, replaced_by=NEW, replaced_jobs="report-1"))
    assert kube.said() == [
        (
            "Replaced",
            f"run report-1 was stopped and gave up lease {NAMESPACE}/cronlock-report: replaced "
            f"by {NEW} (run report-2) under the replace policy",
        )
    ]
    assert (
        kube.jobs[(NAMESPACE, "report-1")]["metadata"]["annotations"]["cronlock.io/replaced-by"]
        == NEW
    )
    assert metrics.registry.get_sample_value("cronlock_replacements_total") == replacements + 1
    # Its retry pod skipped (gate exit 75): the Job fails through the skip rule.
    failed = finished_job("report-1", "2026-12-01T00:00:01Z", skipped=True)
    failed["metadata"]["annotations"] = kube.jobs[(NAMESPACE, "report-1")]["metadata"][
        "annotations"
    ]
    arrive(reconciler, kube, failed)
    reconciler.accounting.account_runs(RunsKey(NAMESPACE, "report"))
    assert skipped_events(kube) == []
    assert kube.deleted == []
    assert skips.consecutive_skips(kube.cronjob) == 0


def test_notes_about_unknown_jobs_tell_nothing(guarded: tuple[Reconciler, RecordingKube]) -> None:
    reconciler, kube = guarded
    told(reconciler, kube, lease_with(OLD, overlap="someone-else_12345678"))
    told(reconciler, kube, lease_with("", replaced_by=NEW, replaced_jobs="gone-job"))
    assert kube.said() == []


def test_notes_on_another_locks_lease_tell_nothing_about_this_locks_runs(
    guarded: tuple[Reconciler, RecordingKube],
) -> None:
    """Security review N10: a pod that may write the Lease of lock `digest` names a run of
    lock `report` in its notes; that run is neither marked, told about, nor kept from its
    count."""
    reconciler, kube = guarded
    arrive(reconciler, kube, running_job("report-1", "2026-12-01T00:00:01Z"))
    foreign = make_lease(
        OLD,
        lock="digest",
        namespace=NAMESPACE,
        annotations={
            "cronlock.io/overlap": "report-1-aaaaa_11111111",
            "cronlock.io/replaced-by": NEW,
            "cronlock.io/replaced-jobs": "report-1",
        },
    )
    reconciler.on_lease("MODIFIED", foreign)
    reconciler.accounting.tell_contention(ContentionKey(NAMESPACE, "cronlock-digest"))
    assert kube.said() == []
    assert "annotations" not in kube.jobs[(NAMESPACE, "report-1")]["metadata"]
    assert (NAMESPACE, "report-1") not in reconciler.accounting.contended
    # Its real outcome is counted as ever: a skip.
    arrive(reconciler, kube, finished_job("report-1", "2026-12-01T00:00:01Z", skipped=True))
    reconciler.accounting.account_runs(RunsKey(NAMESPACE, "report"))
    assert [reason for reason, _ in kube.said()] == ["Skipped"]


def test_the_job_of_a_sidecar_identity() -> None:
    assert contention.job_of("report-29001-x7k2p_3f2a9c1e") == "report-29001"
    assert contention.job_of("laptop_4242_0a1b2c3d") == ""  # `run` outside a pod
    assert contention.job_of("") == ""
    exactly_57 = "j" * 57
    assert contention.job_of(f"{exactly_57}-abcde_12345678") == exactly_57


def test_a_job_whose_pods_carry_its_name_cut_is_found_by_prefix(
    guarded: tuple[Reconciler, RecordingKube],
) -> None:
    reconciler, kube = guarded
    long_name = "a-rather-long-cronjob-name-for-the-nightly-reports-29001234"
    assert len(long_name) > contention.CUT_JOB_NAME
    arrive(reconciler, kube, running_job(long_name, "2026-12-01T00:00:02Z"))
    pod = f"{long_name[: contention.CUT_JOB_NAME]}bbbbb"  # the API server's generateName
    told(reconciler, kube, lease_with(OLD, overlap=f"{pod}_22222222"))
    assert [reason for reason, _ in kube.said()] == ["Overlap"]
    assert "cronlock.io/overlapped" in kube.jobs[(NAMESPACE, long_name)]["metadata"]["annotations"]


# --- what the accounting tells the reconciler to enqueue ---------------------------------
def test_a_deleted_job_asks_for_a_count_only_when_it_is_a_finished_run_not_yet_counted(
    setup: tuple[Reconciler, RecordingKube],
) -> None:
    accounting = setup[0].accounting
    running = running_job("report-1", "2026-12-01T00:00:01Z")
    marked = finished_job("report-2", "2026-12-01T00:00:02Z")
    marked["metadata"]["annotations"] = {skips.ACCOUNTED_ANNOTATION: "skipped"}
    counted = finished_job("report-3", "2026-12-01T00:00:03Z")
    accounting.accounted.add("uid-report-3")
    uncounted = finished_job("report-4", "2026-12-01T00:00:04Z")

    assert accounting.job_seen(running) is None
    assert accounting.job_seen(uncounted) == "report"
    assert accounting.job_deleted((NAMESPACE, "report-1"), running) is None
    assert accounting.job_deleted((NAMESPACE, "report-2"), marked) is None
    assert accounting.job_deleted((NAMESPACE, "report-3"), counted) is None
    assert accounting.job_deleted((NAMESPACE, "report-4"), uncounted) == "report"
    assert accounting.accounted == set()
    assert list(accounting.departed) == [(NAMESPACE, "report-4")]


def test_a_lease_asks_for_its_notes_to_be_told_once_per_change(
    setup: tuple[Reconciler, RecordingKube],
) -> None:
    reconciler, _ = setup
    key = (NAMESPACE, "cronlock-report")
    assert not reconciler.accounting.lease_seen(key, read_lease(lease_with(OLD)), "report")
    noted = read_lease(lease_with(OLD, overlap=NEW))
    assert reconciler.accounting.lease_seen(key, noted, "report")
    assert not reconciler.accounting.lease_seen(key, noted, "report")  # a replay, or a renewal
    reconciler.accounting.lease_deleted(key)
    assert reconciler.accounting.lease_seen(key, noted, "report")  # the Lease made again


def test_runs_named_by_notes_are_kept_up_to_a_bound_oldest_dropped_first(
    setup: tuple[Reconciler, RecordingKube], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(accounting_module, "MAX_CONTENDED", 2)
    accounting = setup[0].accounting
    for number in (1, 2, 3):
        lease = lease_with(OLD, overlap=f"report-{number}-ccccc_3333333{number}")
        accounting.lease_seen((NAMESPACE, "cronlock-report"), read_lease(lease), "report")
    assert list(accounting.contended) == [(NAMESPACE, "report-2"), (NAMESPACE, "report-3")]


# --- already ran (issue 56): the runtime reads the skipped pod's gate ------------------

ALREADY_RAN = (
    "already ran: tick 2026-12-01T00:00:00Z of report on lock report was claimed by job "
    "report-29416320 (run uid-a, holder pod-a, cluster east) for tick 2026-12-01T00:00:00Z; "
    "skipping this run"
)


def gate_said(job: dict[str, Any], message: str) -> dict[str, Any]:
    """The pod the Job's Failed condition names, its gate terminated 75 with `message`."""
    name = job["metadata"]["name"]
    return {
        "metadata": {
            "name": f"{name}-x",
            "namespace": NAMESPACE,
            "ownerReferences": [
                {"kind": "Job", "name": name, "uid": job["metadata"]["uid"], "controller": True}
            ],
        },
        "status": {
            "initContainerStatuses": [
                {
                    "name": "cronlock-gate",
                    "state": {"terminated": {"exitCode": 75, "message": message}},
                }
            ]
        },
    }


def test_a_skip_whose_gate_said_already_ran_is_told_and_not_counted_in_a_row(
    setup: tuple[Reconciler, RecordingKube],
) -> None:
    reconciler, kube = setup
    cronjob = kube.cronjob
    cronjob["spec"] = desired_cronjob(cronjob, parse_config(cronjob, SETTINGS), SETTINGS)["spec"]
    first = finished_job("report-29416320", "2026-12-01T00:00:01Z")
    second = finished_job("report-29416321", "2026-12-01T00:01:01Z")
    for job in (first, second):  # made by the CronJob controller from the injected CronJob
        job["spec"] = copy.deepcopy(cronjob["spec"]["jobTemplate"]["spec"])
    kube.pods[(NAMESPACE, "report-29416320-x")] = gate_said(first, ALREADY_RAN)
    kube.pods[(NAMESPACE, "report-29416321-x")] = gate_said(second, "lease is held")
    arrive(reconciler, kube, first)
    arrive(reconciler, kube, second)
    before = metrics.registry.get_sample_value("cronlock_runs_total", {"result": "already_ran"})

    reconciler.accounting.account_runs(RunsKey(NAMESPACE, "report"))

    assert kube.said()[:2] == [
        ("TickAlreadyRan", f"run report-29416320: {ALREADY_RAN}"),
        (
            "Skipped",
            "run report-29416321 skipped: lock report was held by another run (1 in a row)",
        ),
    ]
    assert kube.cronjob["metadata"]["annotations"]["cronlock.io/consecutive-skips"] == "1"
    after = metrics.registry.get_sample_value("cronlock_runs_total", {"result": "already_ran"})
    assert (after or 0) - (before or 0) == 1


@pytest.mark.parametrize("unreadable", [False, True])
def test_a_skip_whose_pod_is_gone_or_unreadable_is_a_skip_as_before(
    setup: tuple[Reconciler, RecordingKube], unreadable: bool
) -> None:
    reconciler, kube = setup
    job = finished_job("report-29416320", "2026-12-01T00:00:01Z")
    if unreadable:
        kube.pods[(NAMESPACE, "report-29416320-x")] = gate_said(job, ALREADY_RAN)
        kube.fail["read_pod"] = Retry("get pod: HTTP 403 Forbidden")
    arrive(reconciler, kube, job)

    reconciler.accounting.account_runs(RunsKey(NAMESPACE, "report"))

    assert [reason for reason, _ in kube.said()] == ["Skipped"]
    if not unreadable:  # it asked, and the pod was gone (a failed call is not recorded)
        assert ("read_pod", (NAMESPACE, "report-29416320-x")) in kube.calls
    assert kube.cronjob["metadata"]["annotations"]["cronlock.io/consecutive-skips"] == "1"


def test_a_job_deleted_while_its_count_is_decided_is_counted_once(
    setup: tuple[Reconciler, RecordingKube],
) -> None:
    """The CronJob controller deletes an old failed Job (failedJobsHistoryLimit) while the
    operator reads its pod to tell an "already ran" skip: the deletion is seen before the
    run is claimed, and the Job was counted again later from its last state (a fresh run
    of e87f6b8 posted "(2 in a row)" and "(1 in a row)" for one run)."""
    reconciler, kube = setup
    job = finished_job("report-29416320", "2026-12-01T00:00:01Z")
    arrive(reconciler, kube, job)
    reading_pod = kube.read_pod

    def deleted_meanwhile(namespace: str, name: str) -> dict[str, Any] | None:
        if (NAMESPACE, "report-29416320") in kube.jobs:
            del kube.jobs[(NAMESPACE, "report-29416320")]
            reconciler.on_job("DELETED", job)
        return reading_pod(namespace, name)

    kube.read_pod = deleted_meanwhile  # type: ignore[method-assign]
    reconciler.accounting.account_runs(RunsKey(NAMESPACE, "report"))
    reconciler.accounting.account_runs(RunsKey(NAMESPACE, "report"))

    assert skipped_events(kube) == [
        "run report-29416320 skipped: lock report was held by another run (1 in a row)"
    ]
    assert reconciler.accounting.departed == {}
