"""cronlock.io/max-hold in the operator: injected into the sidecar when set, and a run its
sidecar stopped at the bound is one `MaxHoldExceeded` Warning, counted once."""

from __future__ import annotations

import copy
from typing import Any

from cronlock_operator.cronjob.config import parse_config
from cronlock_operator.injection.build import build_injection, desired_cronjob, revert
from cronlock_operator.reconcile.actions import CountMaxHoldExceeded, SetRunTimes
from cronlock_operator.reconcile.keys import RunsKey
from cronlock_operator.runtime import metrics
from cronlock_operator.runtime.executor import Executor
from cronlock_operator.runtime.reconciler import Reconciler
from tests.support import gen
from tests.support.cronjobs import SETTINGS, pod_spec
from tests.support.fakekube import FakeKube
from tests.support.leases import MOMENT, make_lease
from tests.unit.operator.test_accounting import NAMESPACE, RecordingKube, arrive

JOB = "report-29416320"
POD = f"{JOB}-k8x2q"
LINE = "max-hold exceeded: held 10.2s, bound 10s"


def sidecar_env(cronjob: dict[str, Any]) -> dict[str, Any]:
    injected = build_injection(cronjob, parse_config(cronjob, SETTINGS), SETTINGS)
    [sidecar] = [c for c in pod_spec(injected)["initContainers"] if c["name"] == "cronlock"]
    return {item["name"]: item.get("value") for item in sidecar["env"]}


def test_the_bound_is_injected_into_the_sidecar_only_when_set() -> None:
    bounded = gen.cronjob("report", gen.annotated({"cronlock.io/max-hold": "1h30m"}))
    assert sidecar_env(bounded)["CRONLOCK_MAX_HOLD"] == "1h30m"
    assert "CRONLOCK_MAX_HOLD" not in sidecar_env(gen.cronjob("report"))
    assert "CRONLOCK_MAX_HOLD" not in sidecar_env(
        gen.cronjob("report", gen.annotated({"cronlock.io/max-hold": "0"}))
    )
    injected = build_injection(bounded, parse_config(bounded, SETTINGS), SETTINGS)
    assert build_injection(injected, parse_config(injected, SETTINGS), SETTINGS) == injected
    assert revert(injected) == bounded


def sidecar_said(
    job: dict[str, Any], message: str, *, owner_uid: str | None = None
) -> dict[str, Any]:
    """A pod of `job` (or of the Job with `owner_uid`) whose sidecar terminated with
    `message` as its termination message."""
    return {
        "metadata": {
            "name": POD,
            "namespace": NAMESPACE,
            "ownerReferences": [
                {
                    "kind": "Job",
                    "name": JOB,
                    "uid": owner_uid or job["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "status": {
            "initContainerStatuses": [
                {"name": "cronlock-gate", "state": {"terminated": {"exitCode": 0}}},
                {
                    "name": "cronlock",
                    "state": {"terminated": {"exitCode": 0, "message": message + "\n"}},
                },
            ]
        },
    }


def a_failed_run(
    message: str, *, owner_uid: str | None = None
) -> tuple[Reconciler, RecordingKube, dict[str, Any]]:
    """CronJob report (injected) whose run JOB failed; its Lease named POD as JOB's holder,
    and POD's sidecar said `message`."""
    cronjob = gen.cronjob("report", gen.in_namespace(NAMESPACE), gen.with_uid("cj"))
    kube = RecordingKube(cronjob)
    cronjob = kube.cronjob
    cronjob["spec"] = desired_cronjob(cronjob, parse_config(cronjob, SETTINGS), SETTINGS)["spec"]
    reconciler = Reconciler(kube=kube, settings=SETTINGS)
    job = gen.job(
        JOB,
        gen.in_namespace(NAMESPACE),
        gen.created_at("2026-12-01T00:00:01Z"),
        gen.of_lock("report"),
        gen.owned_by("report", "cj"),
        gen.gated(),
        gen.failed(),
    )
    job["spec"] = copy.deepcopy(cronjob["spec"]["jobTemplate"]["spec"])
    lease = make_lease(f"{POD}_1f2e3d4c", namespace=NAMESPACE, acquired=MOMENT, job=JOB)
    reconciler.on_lease("MODIFIED", lease)
    kube.pods[(NAMESPACE, POD)] = sidecar_said(job, message, owner_uid=owner_uid)
    arrive(reconciler, kube, job)
    return reconciler, kube, job


def exceeded() -> float:
    value = metrics.registry.get_sample_value(
        "cronlock_max_hold_exceeded_total", {"namespace": NAMESPACE, "cronjob": "report"}
    )
    return value or 0.0


def test_a_run_stopped_at_its_max_hold_is_one_warning_and_one_count() -> None:
    reconciler, kube, _ = a_failed_run(LINE)
    before = exceeded()

    reconciler.accounting.account_runs(RunsKey(NAMESPACE, "report"))
    arrive(reconciler, kube, kube.jobs[(NAMESPACE, JOB)])  # a replayed event
    reconciler.accounting.account_runs(RunsKey(NAMESPACE, "report"))

    warnings = [(reason, message) for _, reason, message, warning in kube.events if warning]
    assert warnings == [
        (
            "MaxHoldExceeded",
            f"run {JOB} held lock report past cronlock.io/max-hold, so its work was stopped "
            f"and the lock given back once it ended: {LINE}",
        )
    ]
    assert exceeded() - before == 1
    assert ("read_pod", (NAMESPACE, POD)) in kube.calls


def test_a_run_whose_sidecar_said_nothing_of_max_hold_posts_no_warning() -> None:
    reconciler, kube, _ = a_failed_run("")
    reconciler.accounting.account_runs(RunsKey(NAMESPACE, "report"))
    assert [reason for _, reason, _, _ in kube.events if reason == "MaxHoldExceeded"] == []


def test_another_jobs_pod_cannot_lend_its_line_to_this_run() -> None:
    reconciler, kube, _ = a_failed_run(LINE, owner_uid="someone-elses-job")
    reconciler.accounting.account_runs(RunsKey(NAMESPACE, "report"))
    assert [reason for _, reason, _, _ in kube.events if reason == "MaxHoldExceeded"] == []


def test_the_line_is_cut_to_one_printable_line() -> None:
    reconciler, kube, _ = a_failed_run(LINE + "\x1b[31m" + "x" * 5000 + "\nsecond line")
    reconciler.accounting.account_runs(RunsKey(NAMESPACE, "report"))
    [message] = [m for _, reason, m, _ in kube.events if reason == "MaxHoldExceeded"]
    assert "\x1b" not in message
    assert "second line" not in message
    assert len(message) < 1024 + 200


def test_the_counter_exists_from_zero_once_the_cronjob_is_known_and_goes_with_it() -> None:
    """increase() sees the first stop only if the series was there at 0 before it."""
    labels = {"namespace": "team-m", "cronjob": "bounded"}
    executor = Executor(FakeKube())
    executor.run([SetRunTimes("team-m", "bounded", 1e9, None, False)])
    assert metrics.registry.get_sample_value("cronlock_max_hold_exceeded_total", labels) == 0.0
    executor.run([CountMaxHoldExceeded("team-m", "bounded")])
    assert metrics.registry.get_sample_value("cronlock_max_hold_exceeded_total", labels) == 1.0
    metrics.forget_cronjob("team-m", "bounded")
    assert metrics.registry.get_sample_value("cronlock_max_hold_exceeded_total", labels) is None
