"""The short CI version of the mutual-exclusion checker (tests/reliability), on a real cluster.

The long version is `python -m tests.reliability.checker` (docs/RELIABILITY.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from tests.reliability.checker import (
    CLOCK_AHEAD,
    CONTROL_PLANE_FAULTS,
    FREEZE,
    HA_FAULTS,
    PROCESS_FAULTS,
    STORE_FAULTS,
    Checker,
    Settings,
)
from tests.support.controlplane import ControlPlane, own_controlplane
from tests.support.paths import ROOT

pytestmark = pytest.mark.controlplane

# ttl 4s, renew 1s: the holder gives up after 2.7s without a renew, others take over after
# renewTime + 6s; a lock left by a dead holder must be used again within 10s. Contenders'
# wall clocks are up to 1.5s apart (the model allows 2s: skew + ttl/3 - kill grace).
SHORT = Settings(
    ttl=4.0,
    renew=1.0,
    skew=2.0,
    slack=4.0,
    contenders=3,
    runs_per_trial=3,
    work=(0.8, 1.5),
    wait_timeout=20.0,
    trial_timeout=60.0,
    clock_spread=1.5,
)


def covering(trials: int, settings: Settings = SHORT, set_up: float = 60.0) -> float:
    """A test's timeout that covers its trials at their own limit, plus its set-up: the
    checker then reports a slow trial (`timed_out_trials`) before pytest cuts it off."""
    return trials * settings.trial_timeout + set_up


def seed() -> int:
    """Random per run, printed, and fixed by CRONLOCK_RELIABILITY_SEED to replay a failure."""
    fixed = os.environ.get("CRONLOCK_RELIABILITY_SEED")
    return int(fixed) if fixed else secrets.randbelow(2**31)


def check(
    controlplane: ControlPlane,
    tmp_path: Path,
    faults: Sequence[str],
    trials: int,
    settings: Settings = SHORT,
) -> dict[str, Any]:
    checker = Checker(controlplane, tmp_path, settings, faults, seed(), log=print)
    report = checker.run(trials, faults_per_trial=2)
    print(json.dumps(report, indent=2))
    return report


# replace: every new contender asks the holder to yield, so most work units are stopped
# part-way (exit 70, replaced); a holder a fault froze or killed cannot answer and is
# waited for until its Lease expired. Its work units are longer than a renew interval, so
# that a holder still works when the next contender asks.
REPLACING = dataclasses.replace(SHORT, policy="replace", work=(2.5, 4.0))


@pytest.mark.timeout(covering(3))
@pytest.mark.parametrize("settings", [SHORT, REPLACING], ids=["wait", "replace"])
@pytest.mark.parametrize(
    "faults", [PROCESS_FAULTS, CONTROL_PLANE_FAULTS], ids=["process-faults", "control-plane-faults"]
)
def test_at_most_one_work_unit_runs_at_a_time_under_faults(
    controlplane: ControlPlane, tmp_path: Path, faults: Sequence[str], settings: Settings
) -> None:
    if controlplane.env_dir is None and faults is CONTROL_PLANE_FAULTS:
        pytest.skip("control plane faults need the local control plane")
    report = check(controlplane, tmp_path, faults, trials=3, settings=settings)
    assert report["faults"] == 6
    assert report["fault_errors"] == 0, report["by_fault"]
    assert report["overlaps"] == 0, report
    assert report["delayed"] == 0, report["by_fault"]
    assert report["timed_out_trials"] == 0
    assert report["runs"] >= 9
    if settings.policy == "replace":
        assert report["stopped_runs"] >= 1, report  # runs were replaced, not only queued


@pytest.mark.timeout(covering(2, set_up=120.0))  # two more API servers to start
def test_at_most_one_work_unit_runs_at_a_time_under_ha_control_plane_faults(
    tmp_path: Path,
) -> None:
    """A control plane as production runs it (3 etcd members, 2 API servers behind a
    balancer), each of its faults once: the etcd leader killed and started again, one API
    server restarted, one cut from etcd, one paused. The long version: docs/RELIABILITY.md."""
    with own_controlplane(tmp_path / "ha", ha=True) as plane:
        report = check(plane, tmp_path / "checker", HA_FAULTS, trials=2)
    assert report["faults"] == 4
    assert sorted(report["by_fault"]) == sorted(HA_FAULTS), report["by_fault"]
    assert report["fault_errors"] == 0, report["by_fault"]
    assert report["overlaps"] == 0, report
    assert report["delayed"] == 0, report["by_fault"]
    assert report["timed_out_trials"] == 0
    assert report["runs"] >= 6


@pytest.mark.timeout(covering(1))
def test_the_checker_sees_the_overlap_a_host_frozen_past_the_ttl_causes(
    controlplane: ControlPlane, tmp_path: Path
) -> None:
    """Outside the guarantee, and the proof the checker can fail: the frozen work unit still
    holds the local lock when a new holder starts, so the new holder's flock fails; and what
    the fencing token is for: the resumed work unit's writes carry the older token, refused."""
    report = check(controlplane, tmp_path, [FREEZE], trials=1)
    assert report["faults"] == 1
    assert report["overlaps"] == 0  # no fault inside the guarantee was injected
    assert report["overlaps_outside_guarantee"] >= 1, report
    assert report["refused_stale_writes"] >= 1, report


@pytest.mark.timeout(covering(1))
def test_a_contender_whose_clock_is_ahead_beyond_the_model_takes_the_lock_from_a_live_holder(
    controlplane: ControlPlane, tmp_path: Path
) -> None:
    """Outside the guarantee, and why the clock bound in docs/RELIABILITY.md is real: a wall
    clock ahead by more than ttl + skew sees the live holder's Lease as expired and takes it.
    The holder finds out at its next renew and is stopped (exit 70), or its work unit is
    still running when the new one starts (an overlap); its later writes are refused."""
    report = check(controlplane, tmp_path, [CLOCK_AHEAD], trials=1)
    assert report["faults"] == 1
    assert report["fault_errors"] == 0, report["by_fault"]
    assert report["overlaps"] == 0  # no fault inside the guarantee was injected
    displaced = report["exit_codes"].get("70", 0)
    assert displaced + report["overlaps_outside_guarantee"] >= 1, report


@pytest.mark.timeout(covering(1))
@pytest.mark.parametrize("kind", ["redis"])  # PostgreSQL: the long run, and test_stores.py
def test_with_the_lock_in_a_store_its_faults_and_a_clock_far_ahead_cause_no_overlap(
    controlplane: ControlPlane, tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    """`--store`: the network to the store cut, and a contender whose clock is ahead
    beyond ttl + skew, which on the Lease takes the lock (the test above) and here cannot:
    the store's clock judges the lock's age."""
    server = request.getfixturevalue(f"{kind}_store")
    # One trial each, for CI's time: a paused server is in test_stores.py, and every store
    # fault many times in the long run (docs/RELIABILITY.md).
    faults = ["cut-network", CLOCK_AHEAD]
    assert set(faults) - {CLOCK_AHEAD} <= set(STORE_FAULTS)
    checker = Checker(
        controlplane, tmp_path, SHORT, faults, seed(), log=print, store=(kind, server)
    )
    report = checker.run(1, faults_per_trial=2)
    print(json.dumps(report, indent=2))
    assert report["store"] == kind
    assert sorted(report["by_fault"]) == sorted(faults)
    assert report["fault_errors"] == 0, report["by_fault"]
    assert report["overlaps"] == 0, report
    assert report["overlaps_outside_guarantee"] == 0, report
    assert report["delayed"] == 0, report["by_fault"]
    assert report["timed_out_trials"] == 0


# Tick mode: a tick every 2s given to two contenders started up to 0.5s apart (as two
# clusters' pods of one tick), work shorter than the spacing, six ticks and more until each
# fault's recovery is seen. The long version: docs/RELIABILITY.md, "Ticks".
TICKING = dataclasses.replace(
    SHORT, ticks=True, contenders=2, runs_per_trial=6, work=(0.3, 0.8), tick_spacing=2.0
)


def check_ticks(
    controlplane: ControlPlane,
    tmp_path: Path,
    kind: str,
    server: Any,
    settings: Settings = TICKING,
) -> dict[str, Any]:
    faults = ["kill-holder", "cut-network"]
    checker = Checker(
        controlplane, tmp_path, settings, faults, seed(), log=print, store=(kind, server)
    )
    report = checker.run(1, faults_per_trial=2)
    print(json.dumps(report, indent=2))
    assert sorted(report["by_fault"]) == sorted(faults)
    assert report["fault_errors"] == 0, report["by_fault"]
    assert report["overlaps"] == 0, report
    assert report["timed_out_trials"] == 0
    assert report["ticks"]["ticks"] >= settings.runs_per_trial, report["ticks"]
    return report


@pytest.mark.timeout(covering(1))
@pytest.mark.parametrize("kind", ["redis", "postgres"])
def test_ticks_given_to_two_contenders_under_faults_are_each_worked(
    controlplane: ControlPlane, tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    """Each tick to two `run --tick T --tick-of reliability` contenders, a holder killed
    mid-tick and the network to the store cut: no tick lost while its contenders could
    reach the store, and none worked twice."""
    report = check_ticks(controlplane, tmp_path, kind, request.getfixturevalue(f"{kind}_store"))
    assert report["ticks"]["worked_twice"] == 0, report["ticks"]
    assert report["ticks"]["lost_while_healthy"] == 0, report["ticks"]
    assert report["ticks"]["worked"] >= 1, report["ticks"]


@pytest.mark.timeout(covering(1))
def test_the_tick_checker_counts_a_tick_two_runs_worked(
    controlplane: ControlPlane, tmp_path: Path, redis_store: Any
) -> None:
    """The proof the tick count can fail: contenders that do not share ticks (each its own
    --tick-of, as a VM whose --tick-of is not the CronJob's name) work one tick twice, and
    the checker counts it."""
    settings = dataclasses.replace(TICKING, tick_of_each=True)
    report = check_ticks(controlplane, tmp_path, "redis", redis_store, settings)
    assert report["ticks"]["worked_twice"] >= 1, report["ticks"]


@pytest.mark.parametrize("offset", [-20.0, 45.0])
def test_a_skewed_contender_writes_its_own_wall_clock_into_the_lease(
    controlplane: ControlPlane, api: kubernetes.client.ApiClient, namespace: str, offset: float
) -> None:
    """The checker's clock offsets are real: the Lease carries the skewed node's time."""
    argv = [
        sys.executable, "-m", "tests.reliability.skewed", f"{offset:+g}",
        "run", "--lease", f"{namespace}/skewed", "--ttl", "30s", "--", "true",
    ]  # fmt: skip
    env = {**controlplane.env, "KUBECONFIG": str(controlplane.kubeconfig), "PYTHONPATH": str(ROOT)}
    before = datetime.now(UTC)
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    after = datetime.now(UTC)
    assert result.returncode == 0, result.stderr
    lease = kubernetes.client.CoordinationV1Api(api).read_namespaced_lease("skewed", namespace)
    acquired = lease.spec.acquire_time
    assert before + timedelta(seconds=offset - 1) < acquired < after + timedelta(seconds=offset + 1)
