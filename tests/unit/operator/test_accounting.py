"""Run accounting: every finished run is counted exactly once, even when its Job is deleted
before the operator gets to it (the CronJob controller keeps one failed Job by default)."""

from __future__ import annotations

from typing import Any

import pytest

from cronlock_operator import skips
from cronlock_operator.reconciler import Reconciler
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
