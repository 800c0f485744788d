"""policy: queue on the real node: queued runs have no pod, each starts only after the
previous one released the lock, in creation order; how long from a release to the next
work's start (docs/PERFORMANCE.md)."""

from __future__ import annotations

import datetime

import pytest

from tests.e2e.scenario import Scenario
from tests.support.kube import wait_for
from tests.support.node import overlapping

RUNS = ("queued-1", "queued-2", "queued-3")


def created(pod: dict[str, object]) -> float:
    stamp = str((pod.get("metadata") or {}).get("creationTimestamp"))  # type: ignore[union-attr]
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@pytest.mark.timeout(120)
def test_queued_runs_start_one_after_another_release_in_order_with_no_pod_while_queued(
    cluster: Scenario,
) -> None:
    assert cluster.history is not None
    cronjob = cluster.cronjob("queued", "echo working; sleep 4", policy="queue")
    assert cronjob["spec"]["jobTemplate"]["spec"]["suspend"] is True
    cluster.run("queued", RUNS[0])
    cluster.main_running(RUNS[0])
    for job in RUNS[1:]:
        cluster.run("queued", job)
    # Queued behind the holder: suspended, no pod.
    for job in RUNS[1:]:
        assert (cluster.job(job) or {}).get("spec", {}).get("suspend") is True, job
        assert cluster.pods(job) == [], job

    works = [wait_for(lambda j=job: cluster.works(j), 60, f"the work of {job}")[0] for job in RUNS]
    wait_for(lambda: works[-1].stopped, 30, f"the work of {RUNS[-1]} to end")

    assert overlapping(cluster.namespace_works()) == []
    assert [work.pod.rsplit("-", 1)[0] for work in sorted(works, key=lambda w: w.started)] == list(
        RUNS
    ), "the queued runs worked in creation order"

    # Each release of the lock (the sidecar's released-at), on this host's monotonic clock.
    releases = sorted(
        {
            (version.released_at, version.released_at - version.offset)
            for version in cluster.history.versions("cronlock-queued")
            if version.released_at is not None
        }
    )
    latencies = []
    for previous, work, job in zip(works, works[1:], RUNS[1:], strict=False):
        assert previous.stopped is not None
        # The release that let this run go: the first after the previous work stopped.
        wall, released = next((w, m) for w, m in releases if m >= previous.stopped)
        pods = cluster.pods(job)
        assert len(pods) == 1, [pod["metadata"]["name"] for pod in pods]
        # No pod of it existed while it was queued: its one pod is younger than the release
        # (creationTimestamp is whole seconds).
        assert created(pods[0]) >= int(wall), (job, pods[0]["metadata"]["creationTimestamp"], wall)
        latencies.append(work.started - released)
    print(
        "queue: release -> next work started: "
        + ", ".join(f"{latency:.2f}s" for latency in latencies)
    )
    assert all(0 < latency < 10 for latency in latencies), latencies
    assert len(cluster.wait_event("queued", "Dequeued", count=len(RUNS))) == len(RUNS)
