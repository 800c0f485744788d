"""A failed test on the real node leaves its evidence: what tests/support/evidence.py keeps,
read back from a run whose sidecar was killed once and a run that skipped beside it."""

from __future__ import annotations

import json
import signal

import pytest
import yaml

from tests.e2e.scenario import GATE, MAIN, SIDECAR, Scenario, hold_then
from tests.support import evidence
from tests.support.kube import wait_for


def restarts(cluster: Scenario, pod: str, container: str) -> int:
    status = cluster.core.read_namespaced_pod(pod, cluster.namespace).status
    for seen in [*(status.init_container_statuses or []), *(status.container_statuses or [])]:
        if seen.name == container:
            return int(seen.restart_count or 0)
    return 0


@pytest.mark.timeout(240)
def test_a_failed_test_keeps_its_pods_logs_events_lease_history_and_kubelet_lines(
    cluster: Scenario, request: pytest.FixtureRequest
) -> None:
    work, pod, _ = hold_then(cluster, "proof", ttl="19s")
    cluster.node.signal_container(cluster.pod_uid(pod), SIDECAR, signal.SIGKILL)
    wait_for(lambda: restarts(cluster, pod, SIDECAR) >= 1, 60, "the kubelet to restart it")
    cluster.run("proof", "proof-2")
    cluster.gate_exit("proof-2")
    assert cluster.history is not None
    # What the `cluster` fixture does when a test fails, done here on purpose, into a folder
    # of this test's own (the fixture's own call is covered by the failing-test check in
    # tests/unit/test_evidence.py).
    folder = evidence.keep(
        request.node.nodeid + "[on-purpose]",
        cluster.api,
        cluster.namespace,
        cluster.recorder,
        cluster.history,
        [cluster.node],
        operator_log=cluster.operator.log(),
    )
    logs = folder / "pods" / pod
    assert "acquired by" in (logs / f"{SIDECAR}.previous.log").read_text()
    assert (logs / f"{SIDECAR}.log").read_text().strip()
    assert (logs / f"{GATE}.log").exists()
    assert "working" in (logs / f"{MAIN}.log").read_text()
    pods = [p["metadata"]["name"] for p in yaml.safe_load_all((folder / "pods.yaml").read_text())]
    assert pod in pods
    assert any(name.startswith("proof-2-") for name in pods)
    events = (folder / "events.txt").read_text()
    assert f"Pod/{pod}" in events
    versions = [json.loads(line) for line in (folder / "leases.jsonl").read_text().splitlines()]
    holders = [
        v["lease"]["spec"].get("holderIdentity") for v in versions
        if v["lease"]["metadata"]["name"] == "cronlock-proof"
    ]  # fmt: skip
    assert any(holder and holder.startswith(pod) for holder in holders)
    assert len(holders) >= 2  # the claim and at least one renewal
    assert pod in (folder / "kubelet.log").read_text()
    assert cluster.namespace in (folder / "operator.log").read_text()
    assert work.pod == pod
