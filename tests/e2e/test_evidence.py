"""A failed test on the real node leaves its evidence: what tests/support/evidence.py keeps,
read back from a run whose sidecar was killed once and a run that skipped beside it."""

from __future__ import annotations

import json
import signal

import pytest
import yaml

from tests.e2e.scenario import GATE, MAIN, SIDECAR, UNTIL_FINISHED, Scenario
from tests.support import evidence
from tests.support.kube import wait_for


def restarts(cluster: Scenario, pod: str, container: str) -> int:
    status = cluster.core.read_namespaced_pod(pod, cluster.namespace).status
    for seen in [*(status.init_container_statuses or []), *(status.container_statuses or [])]:
        if seen.name == container:
            return int(seen.restart_count or 0)
    return 0


@pytest.mark.timeout(300)
def test_a_failed_test_keeps_its_pods_logs_events_lease_history_and_kubelet_lines(
    cluster: Scenario, request: pytest.FixtureRequest
) -> None:
    # A run holds; a second one waits for it (policy wait: no probe runs before its work),
    # and its sidecar is killed while it waits, so the kubelet restarts it (a previous
    # container's log to keep); then the first ends and the second goes ahead.
    cluster.cronjob("proof", f"echo working; {UNTIL_FINISHED}", policy="wait", wait_timeout="240s")
    cluster.run("proof", "proof-1")
    first = cluster.main_running("proof-1")
    cluster.run("proof", "proof-2", "echo second; sleep 1")
    wait_for(lambda: "; waiting up to" in cluster.sidecar_log("proof-2"), 90, "proof-2 to wait")
    waiting = cluster.pods("proof-2")[-1]["metadata"]["name"]
    cluster.node.signal_container(cluster.pod_uid(waiting), SIDECAR, signal.SIGKILL)
    wait_for(lambda: restarts(cluster, waiting, SIDECAR) >= 1, 60, "the kubelet to restart it")
    # Both pods still run, as when a test fails mid-way (once a pod has ended, the kubelet
    # may have removed a restarted container's earlier instance, and its log with it).
    wait_for(
        lambda: "; waiting up to" in cluster.sidecar_log("proof-2"),  # the new instance's
        60,
        "the restarted sidecar to wait again",
    )
    assert cluster.history is not None
    # What the `cluster` fixture does when a test fails, done here on purpose, into a folder
    # of this test's own (tests/unit/test_evidence.py runs the fixture's path: a failing test
    # names its folder in the summary, a passing one keeps none).
    folder = evidence.keep(
        request.node.nodeid + "[on-purpose]",
        cluster.api,
        cluster.namespace,
        cluster.recorder,
        cluster.history,
        [cluster.node],
        operator_log=cluster.operator.log(),
    )
    restarted = folder / "pods" / waiting
    assert "; waiting up to" in (restarted / f"{SIDECAR}.previous.log").read_text()
    assert "; waiting up to" in (restarted / f"{SIDECAR}.log").read_text()
    assert (restarted / f"{GATE}.log").exists()
    assert "working" in (folder / "pods" / first.pod / f"{MAIN}.log").read_text()
    # The holder ends, and the waiting run goes ahead as if nothing had been read.
    cluster.finish(first)
    assert cluster.gate_exit("proof-2") == 0
    assert cluster.main_finished("proof-2") == 0
    pods = [p["metadata"]["name"] for p in yaml.safe_load_all((folder / "pods.yaml").read_text())]
    assert {first.pod, waiting} <= set(pods)
    events = (folder / "events.txt").read_text()
    assert f"Pod/{waiting}" in events
    versions = [json.loads(line) for line in (folder / "leases.jsonl").read_text().splitlines()]
    holders = [
        v["lease"]["spec"].get("holderIdentity") or "" for v in versions
        if v["lease"]["metadata"]["name"] == "cronlock-proof"
    ]  # fmt: skip
    assert any(holder.startswith(first.pod) for holder in holders)
    kubelet = (folder / "kubelet.log").read_text()
    assert waiting in kubelet
    assert first.pod in kubelet
    assert cluster.namespace in (folder / "operator.log").read_text()
