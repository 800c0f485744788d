"""Reading a finished Job: a skip is only the Job controller's failure through our rule."""

from __future__ import annotations

from typing import Any

import pytest

from cronlock_operator.reconcile import skips

SKIP_MESSAGE = (
    "Container cronlock-gate for pod team-a/report-1-x failed with exit code 75 matching "
    "FailJob rule at index 0"
)


def job(*conditions: dict[str, Any], owners: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "report-1", "ownerReferences": owners or []},
        "status": {"conditions": list(conditions)},
    }


@pytest.mark.parametrize(
    ("conditions", "outcome"),
    [
        ([], None),
        ([{"type": "Complete", "status": "True"}], "succeeded"),
        ([{"type": "Complete", "status": "False"}], None),
        (
            [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "PodFailurePolicy",
                    "message": SKIP_MESSAGE,
                }
            ],
            "skipped",
        ),
        # The same rule shape, but another container or another exit code: a failure.
        (
            [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "PodFailurePolicy",
                    "message": SKIP_MESSAGE.replace("cronlock-gate", "main"),
                }
            ],
            "failed",
        ),
        (
            [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "PodFailurePolicy",
                    "message": SKIP_MESSAGE.replace("exit code 75", "exit code 69"),
                }
            ],
            "failed",
        ),
        ([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}], "failed"),
        # Until the Job controller has finished it, a failure target is not an outcome.
        ([{"type": "FailureTarget", "status": "True", "reason": "PodFailurePolicy"}], None),
    ],
)
def test_the_outcome_of_a_job(conditions: list[dict[str, Any]], outcome: str | None) -> None:
    assert skips.outcome(job(*conditions)) == outcome


def test_the_owning_cronjob_is_the_batch_cronjob_owner_only() -> None:
    cronjob = {"apiVersion": "batch/v1", "kind": "CronJob", "name": "report", "uid": "u"}
    other = {"apiVersion": "example.com/v1", "kind": "CronJob", "name": "fake", "uid": "v"}
    assert skips.owning_cronjob(job(owners=[other, cronjob])) == "report"
    assert skips.owning_cronjob(job(owners=[other])) is None
    assert skips.owning_cronjob(job()) is None


@pytest.mark.parametrize(
    ("value", "count"), [("3", 3), ("0", 0), ("-2", 0), ("x", 0), ("9" * 5000, 0)]
)
def test_the_consecutive_skip_counter_reads_garbage_as_zero(value: str, count: int) -> None:
    cronjob = {"metadata": {"annotations": {"cronlock.io/consecutive-skips": value}}}
    assert skips.consecutive_skips(cronjob) == count
