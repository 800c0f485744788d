"""`cronlock freeze` with real pods: a run on a frozen lock skips at the gate, its work never
starts, the operator posts `Frozen`; after `unfreeze` the next run goes ahead."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.e2e.scenario import Scenario
from tests.support.contract import EXIT_SKIPPED
from tests.support.controlplane import ControlPlane
from tests.support.kube import wait_for

CRONLOCK = Path(sys.executable).with_name("cronlock")


def cli(controlplane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CRONLOCK), *args], env=controlplane.env, capture_output=True, text=True, timeout=60
    )


def test_a_frozen_lock_skips_its_runs_at_the_gate_until_it_is_unfrozen(
    cluster: Scenario, controlplane: ControlPlane
) -> None:
    cluster.cronjob("nightly", "echo working; sleep 1", alert_after="1")
    # The operator made its Lease before injecting it: the freeze lives there.
    frozen = cli(controlplane, "freeze", "nightly", "-n", cluster.namespace, "--for", "10m",
                 "--reason", "restore drill")  # fmt: skip
    assert frozen.returncode == 0, frozen.stderr

    cluster.run("nightly", "nightly-1")
    assert cluster.gate_exit("nightly-1") == EXIT_SKIPPED
    log = cluster.sidecar_log("nightly-1")
    assert f"lock frozen: lease {cluster.namespace}/cronlock-nightly frozen until " in log
    assert "by cronlock-admin: restore drill; skipping this run" in log
    assert cluster.works("nightly-1") == [], "a frozen lock's run never starts its work"
    (kind, message), *_ = cluster.wait_event("nightly", "Frozen")
    assert kind == "Normal"
    assert message.startswith("run nightly-1 skipped: lock nightly frozen until ")
    assert message.endswith("by cronlock-admin: restore drill")
    wait_for(lambda: cluster.job("nightly-1") is None, 30, "the operator to delete nightly-1")
    # alert-after 1: a held lock's skip would have raised RepeatedSkips; a freeze does not.
    assert cluster.events("nightly", "RepeatedSkips") == []
    assert cluster.consecutive_skips("nightly") == 0

    assert cli(controlplane, "unfreeze", "nightly", "-n", cluster.namespace).returncode == 0
    cluster.run("nightly", "nightly-2")
    assert cluster.gate_exit("nightly-2") == 0
    assert cluster.main_finished("nightly-2") == 0
