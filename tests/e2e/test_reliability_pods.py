"""The short CI version of the pod-mode checker (tests/reliability/pods.py).

Real pods (the e2e runner), the real operator having injected the CronJob, and faults on
the pods, the API server and the operator. The long version is
`python -m tests.reliability.pods` (docs/RELIABILITY.md).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from pathlib import Path

import kubernetes
import pytest

from tests.conftest import ControlPlane
from tests.e2e.podrunner import PodRunner
from tests.operator_process import OperatorProcess
from tests.reliability.faults import ControlPlaneProcesses
from tests.reliability.pods import POD_FAULTS, PodChecker, PodSettings

pytestmark = pytest.mark.controlplane

TRIALS = 4
FAULTS_PER_TRIAL = 2
# ttl 13s (the operator's minimum), 3 pods at a time, 2 work-unit starts per trial at least.
SHORT = PodSettings(contenders=3, runs_per_trial=2, work=(2.5, 4.0), trial_timeout=120.0)


@pytest.mark.timeout(420)
def test_pod_contenders_never_overlap_under_pod_control_plane_and_operator_faults(
    api: kubernetes.client.ApiClient,
    namespace: str,
    operator: OperatorProcess,
    runner: PodRunner,
    controlplane: ControlPlane,
) -> None:
    components = (
        None
        if controlplane.env_dir is None
        else ControlPlaneProcesses(controlplane.env_dir, controlplane.env)
    )
    faults = [f for f in POD_FAULTS if components is not None or f != "pause-apiserver"]
    seed = int(os.environ.get("CRONLOCK_RELIABILITY_SEED") or secrets.randbelow(2**31))
    print(f"pod-mode checker seed {seed} (CRONLOCK_RELIABILITY_SEED={seed} replays it)")
    # Pods run as UID 65532: their files live where it may go (pytest's tmp is 0700).
    workdir = Path(tempfile.mkdtemp(prefix="cronlock-pods-"))
    checker = PodChecker(
        api,
        runner,
        operator,
        namespace,
        SHORT,
        faults,
        seed,
        components,
        workdir=workdir,
        log=print,
    )
    try:
        report = checker.run(TRIALS, FAULTS_PER_TRIAL)
    finally:
        if operator.process is None or operator.process.poll() is not None:
            operator.start()
    print(json.dumps(report, indent=2))
    shutil.rmtree(workdir, ignore_errors=True)

    assert report["overlaps"] == 0
    assert report["fault_errors"] == 0, report["by_fault"]
    assert report["delayed"] == 0, report["by_fault"]
    assert report["timed_out_trials"] == 0
    assert report["corrupted_cronjobs"] == 0, report["by_fault"]
    assert report["faults"] == TRIALS * FAULTS_PER_TRIAL
    assert set(report["by_fault"]) == set(faults), "every pod-mode fault injected"
    assert report["runs"] >= TRIALS * SHORT.runs_per_trial
    # A fault's recovery is a work unit that started after it: one per fault at least.
    assert report["runs"] >= report["faults"]
    assert operator.process is not None
    assert operator.process.poll() is None
