"""Run accounting: every finished run is counted exactly once, even when its Job is deleted
before the operator gets to it (the CronJob controller keeps one failed Job by default)."""

from __future__ import annotations

from typing import Any

import pytest

from cronlock_operator.reconcile import contention, skips
from cronlock_operator.runtime import metrics
from cronlock_operator.runtime.reconciler import Reconciler
from tests.support.cronjobs import SETTINGS, make_cronjob

NAMESPACE = "team-a"


class RecordingKube:
    """The writes `Reconciler.account_runs` makes, against Jobs held in a dict."""

    def __init__(self, cronjob: dict[str, Any]) -> None:
        self.cronjob = cronjob
        self.jobs: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[str, str]] = []
        self.deleted: list[str] = []
        self.fail_marks = 0

    def read_cronjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.cronjob

    def mark_job(self, namespace: str, name: str, annotation: str, value: str) -> bool:
        if self.fail_marks:
            self.fail_marks -= 1
            raise OSError("connection reset")
        job = self.jobs.get(name)
        if job is None:
            return False
        job["metadata"].setdefault("annotations", {})[annotation] = value
        return True

    def post_event(
        self, involved: dict[str, Any], reason: str, message: str, warning: bool = False
    ) -> None:
        self.events.append((reason, message))

    def delete_job(self, namespace: str, name: str) -> None:
        self.deleted.append(name)
        self.jobs.pop(name, None)

    def annotate_cronjob(self, namespace: str, name: str, annotations: dict[str, Any]) -> None:
        self.cronjob["metadata"]["annotations"].update(annotations)


def finished_job(name: str, created: str, skipped: bool = True) -> dict[str, Any]:
    condition = (
        {
            "type": "Failed",
            "status": "True",
            "reason": "PodFailurePolicy",
            "message": f"Container cronlock-gate for pod {NAMESPACE}/{name}-x failed with "
            "exit code 75 matching FailJob rule at index 0",
        }
        if skipped
        else {"type": "Complete", "status": "True"}
    )
    return {
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "labels": {"cronlock.io/lock": "report"},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "CronJob", "name": "report", "uid": "cj"}
            ],
        },
        "status": {"conditions": [condition]},
    }


@pytest.fixture
def setup() -> tuple[Reconciler, RecordingKube]:
    cronjob = make_cronjob(namespace=NAMESPACE)
    cronjob["metadata"]["uid"] = "cj"
    kube = RecordingKube(cronjob)
    return Reconciler(kube=kube, settings=SETTINGS), kube  # type: ignore[arg-type]


def arrive(reconciler: Reconciler, kube: RecordingKube, job: dict[str, Any]) -> None:
    kube.jobs[job["metadata"]["name"]] = job
    reconciler.on_job("ADDED", job)


def skipped_events(kube: RecordingKube) -> list[str]:
    return [message for reason, message in kube.events if reason == "Skipped"]


def test_a_skipped_job_deleted_before_it_was_counted_is_still_counted(
    setup: tuple[Reconciler, RecordingKube],
) -> None:
    reconciler, kube = setup
    first = finished_job("report-1", "2026-12-01T00:00:01Z")
    second = finished_job("report-2", "2026-12-01T00:00:02Z")
    arrive(reconciler, kube, first)
    arrive(reconciler, kube, second)
    # The CronJob controller deletes the older failed Job before the operator's turn.
    del kube.jobs["report-1"]
    reconciler.on_job("DELETED", first)

    reconciler.account_runs(NAMESPACE, "report")

    assert skipped_events(kube) == [
        "run report-1 skipped: lock report was held by another run (1 in a row)",
        "run report-2 skipped: lock report was held by another run (2 in a row)",
    ]
    assert kube.deleted == ["report-2"]  # the gone one is not deleted again
    assert kube.cronjob["metadata"]["annotations"]["cronlock.io/consecutive-skips"] == "2"


def test_replayed_and_late_events_count_nothing_twice(
    setup: tuple[Reconciler, RecordingKube],
) -> None:
    reconciler, kube = setup
    job = finished_job("report-1", "2026-12-01T00:00:01Z")
    arrive(reconciler, kube, job)
    reconciler.account_runs(NAMESPACE, "report")
    # The watch has not yet shown the mark (the cache holds the unmarked Job) when the
    # next accounting runs, and then the Job's deletion arrives without the mark.
    reconciler.account_runs(NAMESPACE, "report")
    reconciler.on_job("DELETED", finished_job("report-1", "2026-12-01T00:00:01Z"))
    reconciler.account_runs(NAMESPACE, "report")

    assert len(skipped_events(kube)) == 1
    assert reconciler.accounted == set()
    assert reconciler.departed == {}


def test_a_run_whose_mark_failed_is_counted_by_the_retry(
    setup: tuple[Reconciler, RecordingKube],
) -> None:
    reconciler, kube = setup
    arrive(reconciler, kube, finished_job("report-1", "2026-12-01T00:00:01Z"))
    kube.fail_marks = 1
    with pytest.raises(OSError, match="connection reset"):
        reconciler.account_runs(NAMESPACE, "report")
    assert skipped_events(kube) == []

    reconciler.account_runs(NAMESPACE, "report")
    assert len(skipped_events(kube)) == 1


def test_a_success_resets_the_count_in_creation_order(
    setup: tuple[Reconciler, RecordingKube],
) -> None:
    reconciler, kube = setup
    for number, skipped in ((3, True), (1, True), (2, False)):
        job = finished_job(f"report-{number}", f"2026-12-01T00:00:0{number}Z", skipped)
        arrive(reconciler, kube, job)
        if number == 1:
            del kube.jobs["report-1"]
            reconciler.on_job("DELETED", job)

    reconciler.account_runs(NAMESPACE, "report")

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


def lease_with(holder: str, **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "cronlock-report",
            "namespace": NAMESPACE,
            "labels": {"cronlock.io/lock": "report", "app.kubernetes.io/managed-by": "cronlock"},
            "annotations": {
                f"cronlock.io/{key.replace('_', '-')}": v for key, v in annotations.items()
            },
        },
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 60} if holder else {},
    }


def told(reconciler: Reconciler, kube: RecordingKube, lease: dict[str, Any]) -> None:
    reconciler.on_lease("MODIFIED", lease)
    reconciler.tell_contention(NAMESPACE, "cronlock-report")


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
    assert kube.events == [
        (
            "Overlap",
            f"run report-2 started while lease {NAMESPACE}/cronlock-report was held by {OLD} "
            "(observe policy: it ran anyway; under skip it would have been skipped)",
        )
    ]
    assert kube.jobs["report-2"]["metadata"]["annotations"]["cronlock.io/overlapped"] == OLD

    done = finished_job("report-2", "2026-12-01T00:00:02Z", skipped=False)
    done["metadata"]["annotations"] = kube.jobs["report-2"]["metadata"]["annotations"]
    arrive(reconciler, kube, done)
    reconciler.account_runs(NAMESPACE, "report")
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
        reconciler.account_runs(NAMESPACE, "report")  # before tell_contention ran
    assert skips.consecutive_skips(kube.cronjob) == 3
    [warning] = [message for reason, message in kube.events if reason == "RepeatedSkips"]
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
    assert kube.events == [
        (
            "Replaced",
            f"run report-1 was stopped and gave up lease {NAMESPACE}/cronlock-report: replaced "
            f"by {NEW} (run report-2) under the replace policy",
        )
    ]
    assert kube.jobs["report-1"]["metadata"]["annotations"]["cronlock.io/replaced-by"] == NEW
    assert metrics.registry.get_sample_value("cronlock_replacements_total") == replacements + 1
    # Its retry pod skipped (gate exit 75): the Job fails through the skip rule.
    failed = finished_job("report-1", "2026-12-01T00:00:01Z", skipped=True)
    failed["metadata"]["annotations"] = kube.jobs["report-1"]["metadata"]["annotations"]
    arrive(reconciler, kube, failed)
    reconciler.account_runs(NAMESPACE, "report")
    assert skipped_events(kube) == []
    assert kube.deleted == []
    assert skips.consecutive_skips(kube.cronjob) == 0


def test_notes_about_unknown_jobs_tell_nothing(guarded: tuple[Reconciler, RecordingKube]) -> None:
    reconciler, kube = guarded
    told(reconciler, kube, lease_with(OLD, overlap="someone-else_12345678"))
    told(reconciler, kube, lease_with("", replaced_by=NEW, replaced_jobs="gone-job"))
    assert kube.events == []


def test_notes_on_another_locks_lease_tell_nothing_about_this_locks_runs(
    guarded: tuple[Reconciler, RecordingKube],
) -> None:
    """Security review N10: a pod that may write the Lease of lock `digest` names a run of
    lock `report` in its notes; that run is neither marked, told about, nor kept from its
    count."""
    reconciler, kube = guarded
    arrive(reconciler, kube, running_job("report-1", "2026-12-01T00:00:01Z"))
    foreign = lease_with(OLD, overlap="report-1-aaaaa_11111111")
    foreign["metadata"]["name"] = "cronlock-digest"
    foreign["metadata"]["labels"]["cronlock.io/lock"] = "digest"
    foreign["metadata"]["annotations"].update(
        {"cronlock.io/replaced-by": NEW, "cronlock.io/replaced-jobs": "report-1"}
    )
    reconciler.on_lease("MODIFIED", foreign)
    reconciler.tell_contention(NAMESPACE, "cronlock-digest")
    assert kube.events == []
    assert "annotations" not in kube.jobs["report-1"]["metadata"]
    assert (NAMESPACE, "report-1") not in reconciler.contended
    # Its real outcome is counted as ever: a skip.
    arrive(reconciler, kube, finished_job("report-1", "2026-12-01T00:00:01Z", skipped=True))
    reconciler.account_runs(NAMESPACE, "report")
    assert [reason for reason, _ in kube.events] == ["Skipped"]


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
    assert [reason for reason, _ in kube.events] == ["Overlap"]
    assert "cronlock.io/overlapped" in kube.jobs[long_name]["metadata"]["annotations"]
