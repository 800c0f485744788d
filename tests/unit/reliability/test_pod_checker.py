"""The pod-mode checker's own logic: half-done injections, the fault plan, how a pod ended,
the Lease's expiry against the work's stop, recovery, and the work unit's overlap detector."""

from __future__ import annotations

import copy
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cronlock_operator.cronjob.config import parse_config
from cronlock_operator.cronjob.timing import kill_grace_seconds, minimum_ttl_seconds
from cronlock_operator.injection.build import build_injection
from tests.reliability.checker import Counts
from tests.reliability.pod_checks import (
    WorkRecords,
    after_expiry,
    holder_pod,
    injection_problems,
    job_finished,
    job_of_pod,
    lease_end,
    lease_expiry,
    outcome,
    plan_faults,
    recovery_after,
    stale_settings,
)
from tests.reliability.pod_work import (
    HA_POD_FAULTS,
    LONG_WORK_FAULTS,
    POD_FAULTS,
    SHARED_FILES,
    WORK,
    WORK_SCRIPT,
    PodSettings,
    work_command,
)
from tests.reliability.pods import guarantee_held
from tests.support import gen
from tests.support.cronjobs import SETTINGS, pod_spec
from tests.support.node import LeaseVersion, Work

TTL = PodSettings().ttl


def injected(**annotations: str) -> dict[str, Any]:
    cronjob = gen.cronjob("report", gen.annotated({"cronlock.io/ttl": f"{TTL}s", **annotations}))
    return build_injection(cronjob, parse_config(cronjob, SETTINGS), SETTINGS)


# --- settings ------------------------------------------------------------------------------------


def test_the_default_ttl_is_the_operators_minimum_and_both_kill_operator_ttls_are_valid() -> None:
    settings = PodSettings()
    assert settings.ttl == minimum_ttl_seconds(SETTINGS.skew_seconds)
    assert settings.skew == SETTINGS.skew_seconds
    for ttl in settings.ttls:
        parse_config(
            gen.cronjob("report", gen.with_annotations({"cronlock.io/ttl": f"{ttl}s"})), SETTINGS
        )
    assert settings.kill_grace == kill_grace_seconds(settings.ttl, settings.skew, "")
    # The guarantee the checker tests: a lost holder is stopped before its Lease expires.
    assert settings.renew_deadline + 1 + settings.kill_grace + settings.skew < settings.ttl


def test_a_long_work_outlives_its_lease_unless_something_stops_it() -> None:
    settings = PodSettings()
    shortest, _ = settings.long_work_seconds
    assert shortest > max(settings.ttls) + settings.skew
    assert settings.work[1] < settings.renew_deadline, "a normal work ends before any deadline"
    assert set(POD_FAULTS) | set(HA_POD_FAULTS) > LONG_WORK_FAULTS
    assert {"kill-main", "delete-pod", "kill-operator"}.isdisjoint(LONG_WORK_FAULTS)


def test_a_ttl_the_operator_would_refuse_is_refused() -> None:
    with pytest.raises(ValueError, match="too short"):
        PodSettings(ttl=PodSettings().ttl - 1)


# --- injection -----------------------------------------------------------------------------------


def test_the_operators_own_injection_has_no_problems_and_is_up_to_date() -> None:
    cronjob = injected()
    assert injection_problems(cronjob) == []
    assert stale_settings(cronjob) == []
    assert injection_problems(injected(**{"cronlock.io/lock": "shared"})) == []


def test_a_user_cronjob_is_not_injected() -> None:
    assert injection_problems(gen.cronjob("report", gen.restart_policy("Never"))) != []


@pytest.mark.parametrize(
    "corrupt",
    [
        pytest.param(lambda c: pod_spec(c)["initContainers"].pop(1), id="gate missing"),
        pytest.param(
            lambda c: pod_spec(c)["initContainers"].append(
                copy.deepcopy(pod_spec(c)["initContainers"][0])
            ),
            id="sidecar twice",
        ),
        pytest.param(
            lambda c: c["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"].insert(
                0, {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
            ),
            id="our rule not first",
        ),
        pytest.param(
            lambda c: c["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"].append(
                copy.deepcopy(c["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"][0])
            ),
            id="our rule twice",
        ),
        pytest.param(lambda c: pod_spec(c)["volumes"].clear(), id="run-dir volume missing"),
        pytest.param(
            lambda c: pod_spec(c)["containers"][0]["volumeMounts"].clear(), id="mount missing"
        ),
        pytest.param(
            lambda c: pod_spec(c)["containers"][0].pop("livenessProbe"), id="probe missing"
        ),
        pytest.param(
            lambda c: pod_spec(c).update(restartPolicy="OnFailure"), id="restartPolicy kept"
        ),
        pytest.param(
            lambda c: c["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"].clear(),
            id="pod label missing",
        ),
    ],
)
def test_each_half_done_piece_is_a_problem(corrupt: Any) -> None:
    cronjob = injected()
    corrupt(cronjob)
    assert injection_problems(cronjob) != []


def test_a_changed_ttl_is_stale_until_reinjected() -> None:
    cronjob = injected()
    cronjob["metadata"]["annotations"]["cronlock.io/ttl"] = f"{TTL + 1}s"
    assert stale_settings(cronjob) != []
    assert injection_problems(cronjob) == [], "stale is not half-done"
    assert stale_settings(injected(**{"cronlock.io/ttl": f"{TTL + 1}s"})) == []


# --- the fault plan ------------------------------------------------------------------------------


@pytest.mark.parametrize(("trials", "per_trial"), [(4, 2), (8, 1), (14, 2), (3, 3)])
def test_the_plan_spreads_every_fault_kind_evenly(trials: int, per_trial: int) -> None:
    plan = plan_faults(POD_FAULTS, trials, per_trial, random.Random(7))  # noqa: S311
    assert len(plan) == trials
    assert all(len(kinds) == per_trial for kinds in plan)
    counts = [sum(kinds.count(kind) for kinds in plan) for kind in POD_FAULTS]
    assert max(counts) - min(counts) <= 1
    if trials * per_trial >= len(POD_FAULTS):
        assert min(counts) >= 1


def test_no_faults_is_a_plan_of_empty_trials() -> None:
    assert plan_faults([], 3, 2, random.Random(1)) == [[], [], []]  # noqa: S311


def test_every_fault_happens_on_the_node_the_api_server_or_the_operator() -> None:
    assert set(POD_FAULTS) == {
        "cut-pods",
        "stop-sidecar",
        "kill-sidecar",
        "kill-main",
        "delete-pod",
        "node-loss",
        "partition",
        "restart-containerd",
        "evict",
        "preempt",
        "drain",
        "delete-node",
        "pause-apiserver",
        "kill-operator",
    }


# --- how a pod ended, from its status ------------------------------------------------------------


def terminated(name: str, code: int, reason: str = "") -> dict[str, Any]:
    reason = reason or ("Completed" if code == 0 else "Error")
    return {"name": name, "state": {"terminated": {"exitCode": code, "reason": reason}}}


def pod(
    gate: int | None = None,
    main: dict[str, Any] | None = None,
    deleted: bool = False,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p"}
    if deleted:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    init = [{"name": "cronlock", "state": {"running": {}}}]
    if gate is not None:
        init.append(terminated("cronlock-gate", gate))
    else:
        init.append({"name": "cronlock-gate", "state": {"running": {}}})
    status: dict[str, Any] = {"initContainerStatuses": init}
    if main is not None:
        status["containerStatuses"] = [{"name": "main", **main}]
    return {"metadata": metadata, "status": status}


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (None, "no-pod"),
        ({"metadata": {"name": "p"}, "status": {"phase": "Pending"}}, "no-decision"),
        (pod(), "no-decision"),
        (pod(deleted=True), "deleted-before-decision"),
        (pod(gate=75), "skipped"),
        (pod(gate=69), "unavailable"),
        (pod(gate=137, deleted=True), "gate-137"),
        (pod(gate=0), "main-not-started"),
        (
            pod(gate=0, main={"state": {"waiting": {"reason": "PodInitializing"}}}),
            "main-not-started",
        ),
        (pod(gate=0, main={"state": {"running": {}}}), "main-running"),
        (pod(gate=0, main=terminated("main", 0)), "main-0"),
        (pod(gate=0, main=terminated("main", 137)), "main-137"),
        (pod(gate=0, main=terminated("main", 137), deleted=True), "main-137, pod deleted"),
        (pod(gate=0, main=terminated("main", 137, "OOMKilled")), "main-137 (OOMKilled)"),
    ],
)
def test_a_pods_outcome_is_read_from_its_last_status(
    status: dict[str, Any] | None, expected: str
) -> None:
    assert outcome(status) == expected


def test_a_job_is_finished_by_its_complete_or_failed_condition_only() -> None:
    assert not job_finished({})
    assert not job_finished({"status": {"conditions": [{"type": "Suspended", "status": "True"}]}})
    assert not job_finished({"status": {"conditions": [{"type": "Failed", "status": "False"}]}})
    assert job_finished({"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    assert job_finished({"status": {"conditions": [{"type": "Failed", "status": "True"}]}})


# --- the Lease's expiry against the work's stop --------------------------------------------------

# Wall clock = monotonic + OFFSET in these versions.
OFFSET = 1_000_000.0


def version(
    holder: str = "",
    renewed: float | None = None,
    duration: float | None = 13,
    last_holder: str = "",
    released_at: float | None = None,
) -> LeaseVersion:
    return LeaseVersion(
        name="cronlock-x",
        holder=holder,
        renew_time=None if renewed is None else renewed + OFFSET,
        duration=duration,
        last_holder=last_holder,
        released_at=None if released_at is None else released_at + OFFSET,
        offset=OFFSET,
    )


A, B = "x-1-abcde", "x-2-fghij"
A_ID, B_ID = f"{A}_0123abcd", f"{B}_4567ef01"


def test_the_holder_identity_names_its_pod_and_the_pod_its_job() -> None:
    assert holder_pod(A_ID) == A
    assert holder_pod("") == ""
    assert job_of_pod(A) == "x-1"
    assert job_of_pod("pods-1fda6af7-12-3-2ttcr") == "pods-1fda6af7-12-3"


def test_the_expiry_is_the_last_renewal_plus_the_duration_on_the_monotonic_clock() -> None:
    versions = [
        version(A_ID, 100),
        version(A_ID, 102),
        version(A_ID, 104),
        version(B_ID, 120, duration=14),
    ]
    assert lease_expiry(versions, A) == pytest.approx(117)
    assert lease_expiry(versions, B) == pytest.approx(134)
    assert lease_expiry(versions, "x-3-zzzzz") is None


def test_a_release_keeps_the_holders_last_renewal() -> None:
    # The watch missed the renewal at 104; the release that followed carries it.
    versions = [
        version(A_ID, 100),
        version("", 104, last_holder=A_ID, released_at=105),
    ]
    assert lease_expiry(versions, A) == pytest.approx(117)
    assert lease_end(versions, A) == "released"


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        ([], "never"),
        ([version(B_ID, 100)], "never"),
        ([version(A_ID, 100), version(A_ID, 102)], "held"),
        ([version(A_ID, 100), version("", 101, last_holder=A_ID, released_at=103)], "released"),
        # The operator cleared it after it expired (released-at after the expiry).
        ([version(A_ID, 100), version("", 100, last_holder=A_ID, released_at=115.5)], "lost"),
        # Another pod took it over after it expired.
        ([version(A_ID, 100), version(B_ID, 116)], "lost"),
        # Someone else's release.
        ([version(A_ID, 100), version("", 100, last_holder=B_ID, released_at=101)], "lost"),
    ],
)
def test_how_a_hold_ended(versions: list[LeaseVersion], expected: str) -> None:
    assert lease_end(versions, A) == expected


def test_the_work_stop_is_compared_with_the_expiry_of_its_pods_lease() -> None:
    versions = [version(A_ID, 100), version(A_ID, 102), version(B_ID, 120)]
    assert after_expiry(Work(A, 99.0, 110.0), versions) == pytest.approx(110 - 115)
    assert after_expiry(Work(A, 99.0, 116.5), versions) == pytest.approx(1.5), "past expiry"
    assert after_expiry(Work(A, 99.0), versions) is None, "still running"
    assert after_expiry(Work("x-3-zzzzz", 99.0, 100.0), versions) is None, "never held"


def test_the_guarantee_needs_every_work_compared_with_a_lease_it_held() -> None:
    keys = [
        "overlaps",
        "tracker_overlaps",
        "works_past_expiry",
        "delayed",
        "timed_out_trials",
        "leftover_works",
        "corrupted_cronjobs",
        "fault_errors",
    ]
    clean: dict[str, Any] = {key: 0 for key in keys} | {
        "works_without_lease": [],
        "token_regressions": [],
    }
    assert guarantee_held(clean)
    assert not guarantee_held(clean | {"works_without_lease": ["x-1-abcde"]})
    for key in keys:
        assert not guarantee_held(clean | {key: 1}), key


# --- recovery ------------------------------------------------------------------------------------


def test_recovery_runs_from_the_fault_or_the_last_earlier_work_to_the_next_start() -> None:
    works = [Work("a", 10.0, 20.0), Work("b", 25.0, 30.0)]
    assert recovery_after(15.0, works) == pytest.approx(5.0), "from the holder's stop at 20"
    assert recovery_after(22.0, works) == pytest.approx(3.0), "from the fault's end at 22"
    assert recovery_after(27.0, works) is None, "nothing started after it"
    assert recovery_after(0.0, works) is None, "not cleared yet"
    assert recovery_after(15.0, [Work("a", 10.0), Work("b", 25.0)]) is None, "a still runs"


# --- the work unit -------------------------------------------------------------------------------


def test_the_main_container_runs_the_work_under_sh_with_its_duration_last() -> None:
    command = work_command(4242, 3.5)
    assert command[:3] == ["sh", "-c", WORK_SCRIPT]
    assert command[-1] == "3.50"
    assert "4242" in command
    # A command follows the work, so sh stays PID 1 instead of exec'ing it.
    assert WORK_SCRIPT.endswith("; exit $?")


def shared_directory(path: Path, token: int, store: str = "") -> Path:
    for name in SHARED_FILES:
        (path / name).touch()
    (path / "fencing-store").write_text(store)
    (path / "token").write_text(str(token))
    return path / "token"


def start_work(path: Path, port: int, pod: str, seconds: float) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-c", WORK, str(path), str(path / "token"), "127.0.0.1", str(port)]
    return subprocess.Popen([*argv, f"{seconds}"], env=dict(os.environ, HOSTNAME=pod))


def test_a_second_work_while_the_first_runs_records_an_overlap(tmp_path: Path) -> None:
    """The detector can fail: it needs no clock, only the shared file's lock."""
    shared_directory(tmp_path, 3)
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    first = start_work(tmp_path, port, "pod-a", 60)
    try:
        connection, _ = server.accept()
        with connection:
            assert connection.recv(256) == b"pod-a\n"
            records = WorkRecords(tmp_path / "events.jsonl")
            deadline = time.monotonic() + 30
            while not records.counts["start"] and time.monotonic() < deadline:
                time.sleep(0.05)
                records.read()
            second = start_work(tmp_path, port, "pod-b", 0)
            late, _ = server.accept()
            with late:
                assert second.wait(timeout=30) == 0
                assert late.recv(256) == b"pod-b\n"
                assert late.recv(256) == b"", "the tracker sees the work end with its process"
            first.kill()
            first.wait(timeout=30)
            assert connection.recv(256) == b"", "and a killed work too"
    finally:
        first.kill()
        first.wait(timeout=30)
        server.close()
    counts = Counts()
    WorkRecords(tmp_path / "events.jsonl").tally(counts)
    assert (counts.runs, counts.completed, counts.stopped) == (2, 1, 1)
    assert (counts.overlaps, counts.refused) == (1, 0)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert {event["token"] for event in events} == {3}
    assert [event["pod"] for event in events if event["event"] == "overlap"] == ["pod-b"]


def test_a_work_with_an_older_token_has_its_writes_refused(tmp_path: Path) -> None:
    shared_directory(tmp_path, 4, store="9\n")
    server = socket.create_server(("127.0.0.1", 0))
    try:
        work = start_work(tmp_path, server.getsockname()[1], "pod-old", 0)
        connection, _ = server.accept()
        with connection:
            assert work.wait(timeout=30) == 0
    finally:
        server.close()
    counts = Counts()
    WorkRecords(tmp_path / "events.jsonl").tally(counts)
    assert counts.refused >= 1
    assert (counts.runs, counts.completed, counts.overlaps) == (1, 1, 0)
