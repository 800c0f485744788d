"""Runs that end badly: a crash, a lost node, an API server that stops answering."""

from __future__ import annotations

import time

from tests.conftest import ControlPlane
from tests.e2e.conftest import EXIT_SKIPPED, GATE, Scenario, overlapping
from tests.kube import wait_for

TTL = 15.0
SKEW = 2.0


def test_a_crashed_run_releases_at_once_and_the_jobs_retry_acquires(cluster: Scenario) -> None:
    # A long TTL: had the crashed run not given the lock back, the retry would be skipped.
    cluster.cronjob("flaky", "echo working; sleep 1; exit 3", backoff_limit=1, ttl="60s")

    cluster.run("flaky", "flaky-1")
    crashed = cluster.main_finished("flaky-1")
    assert crashed.exit_code == 3
    first_pod = crashed.pod

    lease = wait_for(
        lambda: (
            lease if not (lease := cluster.lease("flaky"))["spec"].get("holderIdentity") else None
        ),
        10,
        "the crashed run to release the Lease",
    )
    assert lease["metadata"]["annotations"]["cronlock.io/last-holder"].startswith(first_pod)

    retry = wait_for(
        lambda: next((w for w in cluster.pods("flaky-1") if w.name != first_pod), None),
        60,
        "the Job's retry pod",
    )
    assert cluster.gate_exit("flaky-1", pod=retry.name) == 0, "the retry took the lock"
    gate = next(r for r in cluster.processes(GATE, "flaky-1") if r.pod == retry.name)
    assert gate.stopped_monotonic is not None
    assert gate.stopped_monotonic - gate.started_monotonic < 10, "decided without waiting"
    assert cluster.main_finished("flaky-1", timeout=30) is not None
    holder = cluster.lease("flaky")["metadata"]["annotations"]["cronlock.io/last-holder"]
    wait_for(
        lambda: cluster.lease("flaky")["metadata"]["annotations"][
            "cronlock.io/last-holder"
        ].startswith(retry.name),
        15,
        f"the retry to hold and release the Lease (last holder {holder})",
    )
    wait_for(lambda: cluster.job_condition("flaky-1") == "Failed", 30, "flaky-1 to fail")
    assert cluster.events("flaky", "Skipped") == [], "a crash is not a skip"
    assert overlapping(cluster.processes("main")) == []


def test_a_lost_node_blocks_the_lock_for_one_ttl_at_most_then_runs_resume(
    cluster: Scenario,
) -> None:
    cluster.cronjob("ingest", "echo ingesting; sleep 60")

    cluster.run("ingest", "ingest-1")
    lost = cluster.main_running("ingest-1")
    cluster.runner.drop(cluster.namespace, lost.pod)
    dropped_at = time.monotonic()
    assert not lost.running
    assert lost.killed_by == "drop"

    cluster.run("ingest", "ingest-2", "echo should not run")
    assert cluster.gate_exit("ingest-2") == EXIT_SKIPPED
    assert time.monotonic() - dropped_at < TTL, "skipped while the lost run's TTL lasted"
    assert f"held by {lost.pod}" in cluster.sidecar_log("ingest-2")

    (kind, message), *_ = cluster.wait_event("ingest", "LeaseExpired", timeout=TTL + SKEW + 30)
    expired_after = time.monotonic() - dropped_at
    assert kind == "Warning"
    assert lost.pod in message
    # The holder last renewed at most a renew period (ttl/3) before the drop.
    assert TTL - TTL / 3 <= expired_after <= TTL + SKEW + 25

    cluster.run("ingest", "ingest-3", "echo ingesting again")
    assert cluster.gate_exit("ingest-3") == 0
    assert cluster.main_finished("ingest-3").exit_code == 0
    skipped = [message for _, message in cluster.events("ingest", "Skipped")]
    assert len(skipped) == 1
    assert skipped[0].startswith("run ingest-2 skipped")


def test_a_run_cut_off_from_the_api_server_is_killed_before_its_ttl_and_nothing_overlaps(
    cluster: Scenario, controlplane: ControlPlane
) -> None:
    cluster.cronjob("sync", "echo syncing; sleep 60")
    cluster.run("sync", "sync-1")
    cut_off = cluster.main_running("sync-1")

    paused_at = time.monotonic()
    controlplane.pause()
    try:
        # Only the runner's own records here: every API call would hang.
        stopped_at = wait_for(
            lambda: cut_off.stopped_monotonic, TTL + 10, "the liveness probe to stop sync-1"
        )
    finally:
        controlplane.resume()

    assert cut_off.killed_by == "liveness"
    assert stopped_at - paused_at < TTL, "stopped before its Lease could expire"
    worker = cluster.runner.worker(cluster.namespace, cut_off.pod)
    main = next(c for c in worker.containers if c.name == "main")
    assert "Liveness probe failed" in (main.kill_reason or "")
    assert "is no longer held by" in cluster.sidecar_log("sync-1")

    # The next runs wait for the Lease to expire (or find it released) and never overlap.
    def next_run() -> str | None:
        job = f"sync-{len(cluster.processes(GATE)) + 1}"
        cluster.run("sync", job, "echo syncing again")
        return job if cluster.gate_exit(job) == 0 else None

    ran = wait_for(next_run, TTL + SKEW + 40, "a later run to go ahead", every=2)
    assert cluster.main_finished(ran).exit_code == 0
    assert overlapping(cluster.processes("main")) == []
