"""Where users are (issue 41), on the real node: a namespace as a platform team's cluster
makes it, with everything beside cronlock at once:

- Pod Security `restricted` enforced;
- a Kyverno-like policy giving every container of every pod and CronJob template a label
  and each request and limit it lacks (cronlock's containers too: it sets no CPU limit);
- an injector appending its own native sidecar to every pod (a mesh or an agent);
- OpenShift's restricted-v2 admission: every container runs as one UID of the namespace's
  range with group 0, set at admission; the operator runs with the chart's setting for it
  (`sidecar.runAsUser=null`, `sidecar.runAsGroup=null`), so cronlock sets no UID itself.

A run holds; one started meanwhile skips at the gate; with `stop: signal` the run whose
sidecar freezes is stopped (the watchdog signals the work as the same platform UID) before
its Lease expires and the next run goes ahead; a frozen lock skips its runs.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.scenario import (
    GATE,
    SIDECAR,
    Scenario,
    next_run_goes_ahead,
    stopped_before_expiry,
)
from tests.support import neighbours
from tests.support.contract import EXIT_SKIPPED
from tests.support.controlplane import ControlPlane
from tests.support.kube import wait_for
from tests.support.node import overlapping

CRONLOCK = Path(sys.executable).with_name("cronlock")
UID = 1000650000  # restricted-v2 gives the first UID of the namespace's range; one such
SKEW = 2.0
# The operator as the chart runs it with `sidecar.runAsUser=null,sidecar.runAsGroup=null`
# (the chart's OpenShift setting): the injected containers get no UID from cronlock.
NODE_OPERATOR_ARGS = ("--sidecar-run-as-user", "", "--sidecar-run-as-group", "")


@pytest.fixture
def neighbourhood(cluster: Scenario, controlplane: ControlPlane) -> Iterator[None]:
    """The namespace enforcing `restricted`, with the three policies bound to it."""
    cluster.core.patch_namespace(
        cluster.namespace,
        {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}},
    )
    text = yaml.safe_dump_all(
        [
            *neighbours.defaults(cluster.namespace),
            *neighbours.injector(cluster.namespace),
            *neighbours.arbitrary_uids(cluster.namespace, UID),
        ]
    )
    controlplane.kubectl("apply", "-f", "-", input_text=text)
    probe = yaml.safe_dump(neighbours.restricted_pod(cluster.namespace, "probe"))

    def taken_up() -> bool:
        out = controlplane.kubectl(
            "create", "--dry-run=server", "-o", "yaml", "-f", "-", input_text=probe, check=False
        )
        return all(mark in out for mark in (neighbours.LABEL, neighbours.INJECTED, str(UID)))

    wait_for(taken_up, 30, "the API server to take up the three policies")
    yield
    controlplane.kubectl("delete", "-f", "-", "--ignore-not-found", input_text=text)


def pod_of(cluster: Scenario, pod: str) -> dict[str, Any]:
    raw = cluster.core.read_namespaced_pod(pod, cluster.namespace)
    body: dict[str, Any] = cluster.api.sanitize_for_serialization(raw)
    return body


def cli(controlplane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CRONLOCK), *args], env=controlplane.env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("neighbourhood")
def test_beside_policies_an_injector_and_platform_uids_runs_hold_skip_stop_and_freeze(
    cluster: Scenario, controlplane: ControlPlane
) -> None:
    script = 'echo "uid $(id -u) gid $(id -g)"; echo working; sleep 300'
    cluster.cronjob("report", script, stop="signal", platform_uid=True)
    # The operator took what the Kyverno-like policy added to its containers as admitted.
    (kind, message), *_ = cluster.wait_event("report", "ChangedByAdmission")
    assert kind == "Normal", message

    cluster.run("report", "report-1")
    work = cluster.main_running("report-1")
    pod = pod_of(cluster, work.pod)
    # Every neighbour acted on the run's pod, and Pod Security admitted it.
    assert pod["metadata"]["labels"][neighbours.LABEL] == "batch"
    init = {c["name"]: c for c in pod["spec"]["initContainers"]}
    assert list(init) == [SIDECAR, GATE, neighbours.INJECTED], "the injector's comes last"
    every = [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]
    assert {c["securityContext"]["runAsUser"] for c in every} == {UID}
    assert {c["securityContext"]["runAsGroup"] for c in every} == {0}
    assert init[SIDECAR]["resources"]["limits"]["cpu"] == neighbours.DEFAULT_LIMITS["cpu"]
    main_log = cluster.core.read_namespaced_pod_log(work.pod, cluster.namespace, container="main")
    assert f"uid {UID} gid 0" in main_log
    lease = cluster.lease("report")
    assert (lease["spec"].get("holderIdentity") or "").startswith(work.pod)

    cluster.run("report", "report-2")
    assert cluster.gate_exit("report-2") == EXIT_SKIPPED
    assert cluster.works("report-2") == []
    assert "already running: lease" in cluster.sidecar_log("report-2")

    # The sidecar freezes: its watchdog signals the work (as the same platform UID).
    expiry = cluster.wait_renewal("report")
    with cluster.sidecar_frozen(work.pod):
        margin = stopped_before_expiry(work, expiry, "the run whose sidecar froze")
    print(f"platform-UID run (signal) stopped {margin:.1f}s before its Lease expired")
    next_run_goes_ahead(cluster, "report", expiry + SKEW)

    frozen = cli(controlplane, "freeze", "report", "-n", cluster.namespace, "--for", "10m",
                 "--reason", "drill")  # fmt: skip
    assert frozen.returncode == 0, frozen.stderr
    cluster.run("report", "report-frozen")
    assert cluster.gate_exit("report-frozen") == EXIT_SKIPPED
    assert "lock frozen: lease" in cluster.sidecar_log("report-frozen")
    assert cluster.works("report-frozen") == []
    assert cli(controlplane, "unfreeze", "report", "-n", cluster.namespace).returncode == 0
    assert overlapping(cluster.namespace_works()) == []
    assert cluster.events("report", "InvalidConfig") == []
