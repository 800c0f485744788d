"""The short CI version of the pod-mode checker (tests/reliability/pods.py).

Real pods on two real nodes (the session's and a second one), the real operator having
injected the CronJob, and every fault kind at least once: on the holder's pod from its
node's host, on its node (partition, containerd, eviction, drain, the Node deleted), on
the API server and on the operator. The long version is `python -m tests.reliability.pods
--nodes 2` (docs/RELIABILITY.md).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.e2e.scenario import Scenario
from tests.reliability.pod_work import POD_FAULTS, PodSettings
from tests.reliability.pods import PodChecker
from tests.support.controlplane import ControlPlane
from tests.support.node import RealNode
from tests.support.processes import ControlPlaneProcesses

pytestmark = pytest.mark.controlplane

FAULTS_PER_TRIAL = 2
TRIALS = -(-len(POD_FAULTS) // FAULTS_PER_TRIAL)  # every kind once at least
# The operator's minimum ttl, 3 pods at a time, 2 work starts per trial at least.
SHORT = PodSettings(contenders=3, runs_per_trial=2, work=(2.5, 4.0), trial_timeout=150.0)


# Every trial at its own limit, plus the set-up (CronJobs, node 2): the checker reports a
# slow trial (timed_out_trials) before pytest would cut it off.
@pytest.mark.timeout(TRIALS * SHORT.trial_timeout + 120)
def test_pod_contenders_never_overlap_under_node_control_plane_and_operator_faults(
    cluster: Scenario, controlplane: ControlPlane, second_node: RealNode
) -> None:
    assert controlplane.env_dir is not None, "the node fixture runs only next to our control plane"
    components = ControlPlaneProcesses(controlplane.env_dir, controlplane.env)
    seed = int(os.environ.get("CRONLOCK_RELIABILITY_SEED") or secrets.randbelow(2**31))
    print(f"pod-mode checker seed {seed} (CRONLOCK_RELIABILITY_SEED={seed} replays it)")
    # The trials' directories are the pods' hostPath volumes; pytest's tmp is not needed.
    workdir = Path(tempfile.mkdtemp(prefix="cronlock-pods-"))
    checker = PodChecker(
        cluster.api,
        [cluster.node, second_node],
        cluster.tracker,
        cluster.recorder,
        cluster.operator,
        cluster.namespace,
        SHORT,
        POD_FAULTS,
        seed,
        components,
        workdir=workdir,
        log=print,
    )
    try:
        report = checker.run(TRIALS, FAULTS_PER_TRIAL)
    finally:
        if cluster.operator.process is None or cluster.operator.process.poll() is not None:
            cluster.operator.start()
    print(json.dumps(report, indent=2))
    shutil.rmtree(workdir, ignore_errors=True)
    rows = report["by_fault"]

    assert report["overlaps"] == 0, "two work units held the shared flock at once"
    assert report["tracker_overlaps"] == 0, "two works of one lock ran at once"
    assert set(rows) == set(POD_FAULTS), "every fault kind injected"
    assert all(row["trials"] >= 1 for row in rows.values())
    assert report["fault_errors"] == 0, rows
    # Every fault's holder stopped before the Lease it held expired: above all where the
    # Lease expired before the holder gave it back (lost_leases).
    for kind, row in rows.items():
        assert row["max_after_expiry_s"] is not None, f"{kind}: holder not compared: {row}"
        assert row["max_after_expiry_s"] < 0, f"{kind}: a work outlived its Lease: {row}"
    assert report["works_past_expiry"] == 0, "no work ran past its Lease's expiry"
    assert report["works_without_lease"] == [], "every work's pod held the Lease"
    assert report["corrupted_cronjobs"] == 0, rows
    assert report["timed_out_trials"] == 0
    assert report["leftover_works"] == 0
    # A fault's recovery is a work that started after it: one per fault at least.
    assert all(None not in row["recovery_s"] for row in rows.values()), rows
    assert report["runs"] >= max(report["faults"], TRIALS * SHORT.runs_per_trial)
    assert len(report["runs_by_node"]) == 2, report["runs_by_node"]
    assert cluster.operator.process is not None
    assert cluster.operator.process.poll() is None, "the operator is alive at the end"
