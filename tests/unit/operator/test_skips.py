"""Reading a finished Job: a skip is only the Job controller's failure through our rule."""

from __future__ import annotations

from typing import Any

import pytest

from cronlock_operator.reconcile import skips
from tests.support import gen

SKIP_MESSAGE = (
    "Container cronlock-gate for pod team-a/report-1-x failed with exit code 75 matching "
    "FailJob rule at index 0"
)


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
    job = gen.job("report-1", gen.with_status({"conditions": conditions}))
    assert skips.outcome(job) == outcome


def test_the_owning_cronjob_is_the_batch_cronjob_owner_only() -> None:
    cronjob = {"apiVersion": "batch/v1", "kind": "CronJob", "name": "report", "uid": "u"}
    other = {"apiVersion": "example.com/v1", "kind": "CronJob", "name": "fake", "uid": "v"}
    both = gen.job("report-1", gen.with_metadata(ownerReferences=[other, cronjob]))
    only_other = gen.job("report-1", gen.with_metadata(ownerReferences=[other]))
    assert skips.owning_cronjob(both) == "report"
    assert skips.owning_cronjob(only_other) is None
    assert skips.owning_cronjob(gen.job("report-1")) is None


@pytest.mark.parametrize(
    ("value", "count"), [("3", 3), ("0", 0), ("-2", 0), ("x", 0), ("9" * 5000, 0)]
)
def test_the_consecutive_skip_counter_reads_garbage_as_zero(value: str, count: int) -> None:
    cronjob = {"metadata": {"annotations": {"cronlock.io/consecutive-skips": value}}}
    assert skips.consecutive_skips(cronjob) == count


# --- already ran (issue 56): the gate's line, read from the pod the Job names ----------

ALREADY_RAN_LINE = (
    "already ran: tick 2026-12-06T12:00:00Z of report on lock report was claimed by job "
    "report-29416320 (run uid-a, holder pod-a, cluster east) for tick 2026-12-06T12:00:00Z; "
    "skipping this run"
)
SKIP_CONDITION = {
    "type": "Failed",
    "status": "True",
    "reason": "PodFailurePolicy",
    "message": SKIP_MESSAGE,
}


def skipped_job() -> dict[str, Any]:
    body = gen.job("report-1", gen.with_status({"conditions": [SKIP_CONDITION]}))
    body["metadata"].update({"namespace": "team-a", "uid": "uid-report-1"})
    return body


def gate_pod(
    message: str = ALREADY_RAN_LINE,
    *,
    exit_code: int = 75,
    owner_uid: str = "uid-report-1",
    controller: bool = True,
    where: str = "state",
    container: str = "cronlock-gate",
) -> dict[str, Any]:
    terminated = {"exitCode": exit_code, "reason": "Error", "message": message}
    return {
        "metadata": {
            "name": "report-1-x",
            "namespace": "team-a",
            "ownerReferences": [
                {"kind": "Job", "name": "report-1", "uid": owner_uid, "controller": controller}
            ],
        },
        "status": {
            "initContainerStatuses": [
                {"name": "cronlock", "state": {"running": {}}},
                {"name": container, where: {"terminated": terminated}},
            ]
        },
    }


def test_the_skipped_pod_is_the_one_the_failed_condition_names_in_the_jobs_namespace() -> None:
    assert skips.skipped_pod(skipped_job()) == "report-1-x"
    elsewhere = skipped_job()
    elsewhere["metadata"]["namespace"] = "team-b"
    assert skips.skipped_pod(elsewhere) is None
    failed = skipped_job()
    failed["status"]["conditions"] = [{"type": "Failed", "status": "True", "reason": "Backoff"}]
    assert skips.skipped_pod(failed) is None
    other_code = skipped_job()
    other_code["status"]["conditions"][0]["message"] = SKIP_MESSAGE.replace("code 75", "code 1")
    assert skips.skipped_pod(other_code) is None


@pytest.mark.parametrize("where", ["state", "lastState"])
def test_a_gate_that_said_already_ran_gives_its_line(where: str) -> None:
    assert skips.already_ran_line(skipped_job(), gate_pod(where=where)) == ALREADY_RAN_LINE


@pytest.mark.parametrize(
    "pod",
    [
        None,  # gone: a skip as before
        gate_pod("lease team-a/cronlock-report is held by pod-a"),  # held: an overlap
        gate_pod("already ran"),  # no colon: not the line
        gate_pod(exit_code=0),  # the gate opened
        gate_pod(container="work"),  # another container's message
        # Another Job's pod: a Failed condition (anyone who may write a Job's status) that
        # names a pod whose gate said already ran borrows nothing.
        gate_pod(owner_uid="uid-report-2"),
        gate_pod(controller=False),
    ],
)
def test_anything_but_the_jobs_own_gate_saying_already_ran_is_no_already_ran(
    pod: dict[str, Any] | None,
) -> None:
    assert skips.already_ran_line(skipped_job(), pod) is None


def test_a_hostile_termination_message_is_cut_to_one_printable_line() -> None:
    hostile = "already ran: " + "x" * 5000 + "\nFAKE: second line\x1b[31m"
    line = skips.already_ran_line(skipped_job(), gate_pod(hostile))
    assert line is not None
    assert len(line) == skips.MAX_ALREADY_RAN_LINE
    assert "\n" not in line
    control = skips.already_ran_line(skipped_job(), gate_pod("already ran: a\x1b[31mb\x07"))
    assert control == "already ran: a?[31mb?"
