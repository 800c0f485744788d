"""Runs that end badly, on the real node: a crash, a cut-off pod, a frozen or killed sidecar,
a lost kubelet. Whatever happens, the old run's work stops before its Lease can expire, and
no two works of one lock ever run at once.

The work's start and stop are the tracker's (the kernel closes the main container's
connection when its processes die); the Lease's expiry is its renewTime +
leaseDurationSeconds, both on this host's clock, which the node shares.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import time

import pytest

from cronlock_operator.cronjob.timing import minimum_ttl_seconds
from cronlock_sidecar.lock.model import Timing
from tests.e2e.scenario import (
    SIDECAR,
    UNTIL_FINISHED,
    Scenario,
    hold_then,
    next_run_goes_ahead,
    stopped_before_expiry,
)
from tests.support.contract import EXIT_SKIPPED, EXIT_UNAVAILABLE
from tests.support.kube import holds, wait_for
from tests.support.node import overlapping

SKEW = 2.0  # the default skew, which these CronJobs keep
# The shortest TTL the operator admits at that skew (19 s): the tightest timing a user can
# ask for, and the shortest wait for each fault's Lease to expire.
TTL_SECONDS = minimum_ttl_seconds(int(SKEW))
TTL = f"{TTL_SECONDS}s"
RENEW_DEADLINE = Timing.of(TTL_SECONDS, skew=SKEW).renew_deadline


def test_a_crashed_run_releases_at_once_and_the_jobs_retry_acquires(cluster: Scenario) -> None:
    # A long TTL: had the crashed run not given the lock back, the retry would be skipped.
    cluster.cronjob("flaky", "echo working; sleep 1; exit 3", backoff_limit=1, ttl="60s")

    cluster.run("flaky", "flaky-1")
    assert cluster.main_finished("flaky-1") == 3
    first_pod = cluster.pods("flaky-1")[0]["metadata"]["name"]

    lease = wait_for(
        lambda: (
            lease if not (lease := cluster.lease("flaky"))["spec"].get("holderIdentity") else None
        ),
        20,
        "the crashed run to release the Lease",
    )
    assert lease["metadata"]["annotations"]["cronlock.io/last-holder"].startswith(first_pod)

    retry = wait_for(
        lambda: next(
            (p["metadata"]["name"] for p in cluster.pods("flaky-1")[1:]),
            None,
        ),
        60,
        "the Job's retry pod",
    )
    assert cluster.gate_exit("flaky-1", pod=retry) == 0, "the retry took the lock"
    assert cluster.main_finished("flaky-1") == 3
    wait_for(
        lambda: cluster.lease("flaky")["metadata"]["annotations"][
            "cronlock.io/last-holder"
        ].startswith(retry),
        20,
        "the retry to hold and release the Lease",
    )
    wait_for(lambda: cluster.job_condition("flaky-1") == "Failed", 30, "flaky-1 to fail")
    assert cluster.events("flaky", "Skipped") == [], "a crash is not a skip"
    assert overlapping(cluster.namespace_works()) == []


@pytest.mark.timeout(240)
def test_a_run_cut_off_from_the_api_server_stops_before_its_lease_expires(
    cluster: Scenario,
) -> None:
    # The scenario, every setting but the TTL the default (liveness stop).
    work, pod, expiry = hold_then(cluster, "sync", ttl=TTL)
    with cluster.node.pods_cut_off():
        cluster.run("sync", "sync-2", "echo must not run")
        margin = stopped_before_expiry(work, expiry, "the cut-off run")
        # The renew deadline after the renewal, then the probe and the pod's grace. It counts
        # from the last renewal, which the test saw only a moment (under load, seconds) before
        # the cut: measured from cut_at, a loaded run stopped 9.1s after, "too early".
        assert work.stopped is not None
        renewed = expiry - TTL_SECONDS
        assert work.stopped - renewed > RENEW_DEADLINE - 1.0, (
            f"stopped {work.stopped - renewed:.1f}s after its last renewal, before the renew "
            f"deadline ({RENEW_DEADLINE:.1f}s)"
        )
    print(f"cut-off run stopped {margin:.1f}s before its Lease expired")
    # SIGKILL at the end of the pod's (capped) grace: `sh` as PID 1 ignores SIGTERM.
    wait_for(
        lambda: (cluster.main_state(pod).get("terminated") or {}).get("exitCode") == 137,
        30,
        "the kubelet to report the main container killed (137)",
    )
    wait_for(lambda: "is no longer held" in cluster.recorder.sidecar_log(pod), 30, "the log")
    # Started while the pods' path was cut: it could not reach the API server, so it
    # failed closed (69) and its work never started.
    assert cluster.gate_exit("sync-2") == EXIT_UNAVAILABLE
    assert cluster.works("sync-2") == []
    next_run_goes_ahead(cluster, "sync", expiry + SKEW)


@pytest.mark.timeout(240)
def test_a_frozen_sidecar_gets_its_run_stopped_before_the_lease_expires(
    cluster: Scenario,
) -> None:
    work, pod, expiry = hold_then(cluster, "freeze", ttl=TTL)
    with cluster.sidecar_frozen(pod):
        margin = stopped_before_expiry(work, expiry, "the run with a frozen sidecar")
    print(f"frozen-sidecar run stopped {margin:.1f}s before its Lease expired")
    next_run_goes_ahead(cluster, "freeze", expiry + SKEW)


@pytest.mark.timeout(240)
def test_a_killed_sidecar_never_leaves_its_run_working_past_the_lease(
    cluster: Scenario,
) -> None:
    work, pod, expiry = hold_then(cluster, "crash", ttl=TTL)
    cluster.node.signal_container(cluster.pod_uid(pod), SIDECAR, signal.SIGKILL)
    killed = time.monotonic()
    # Two outcomes are right. The kubelet restarts a native sidecar at once: one back before
    # its Lease expires resumes the hold (same pod, same identity), renews it, and the run
    # goes on under it. Otherwise the liveness probe stops the run before the Lease expires.
    # Wrong: the run working on while no renewal of its own keeps the Lease valid.
    renewals: list[float] = []  # each renewal since the kill, on this host's monotonic clock

    def outcome() -> str | None:
        renewed = cluster.lease("crash")["spec"].get("renewTime")
        if renewed is not None:
            at = datetime.datetime.fromisoformat(str(renewed).replace("Z", "+00:00"))
            moment = time.monotonic() + at.timestamp() - time.time()
            if moment > killed and moment not in renewals:
                renewals.append(moment)
        if work.stopped:
            return "stopped"
        return "resumed" if f"resumed by {pod}" in cluster.recorder.sidecar_log(pod) else None

    ended = wait_for(outcome, expiry - time.monotonic() + 60, "the run to stop or resume", 0.1)
    if ended == "stopped" and not (renewals and renewals[0] < expiry):
        margin = stopped_before_expiry(work, expiry, "the run whose sidecar was killed")
        print(f"killed-sidecar run stopped {margin:.1f}s before its Lease expired")
        next_run_goes_ahead(cluster, "crash", expiry + SKEW)
        return
    wait_for(lambda: (outcome(), renewals)[1] or None, 30, "the resumed hold's renewal", 0.1)
    holder = cluster.lease("crash")["spec"].get("holderIdentity") or ""
    assert work.stopped or holder.startswith(pod), "the restarted sidecar holds as its pod"
    assert renewals[0] < expiry, f"resumed {renewals[0] - expiry:.1f}s after the Lease expired"
    print(f"killed sidecar restarted and resumed its hold {expiry - renewals[0]:.1f}s early")
    cluster.batch.delete_namespaced_job(
        "crash-1", cluster.namespace, propagation_policy="Background"
    )
    wait_for(lambda: work.stopped, 60, "the run to stop")
    next_run_goes_ahead(cluster, "crash", time.monotonic())


@pytest.mark.timeout(240)
def test_signal_stop_ends_a_cut_off_run_before_its_lease_expires(cluster: Scenario) -> None:
    work, _pod, expiry = hold_then(cluster, "signal", ttl=TTL, stop="signal")
    spec = cluster.read_cronjob("signal")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert spec["shareProcessNamespace"] is True
    with cluster.node.pods_cut_off():
        margin = stopped_before_expiry(work, expiry, "the cut-off run (stop: signal)")
    print(f"cut-off run (signal) stopped {margin:.1f}s before its Lease expired")
    next_run_goes_ahead(cluster, "signal", expiry + SKEW)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", [signal.SIGSTOP, signal.SIGKILL], ids=["frozen", "killed"])
def test_signal_stop_ends_the_run_of_a_frozen_or_killed_sidecar_before_its_lease_expires(
    cluster: Scenario, fault: signal.Signals
) -> None:
    # No liveness probe with `stop: signal`: the sidecar's watchdog process stops the work.
    name = f"signal-{fault.name.lower()}"
    work, pod, expiry = hold_then(cluster, name, ttl=TTL, stop="signal")
    pid = cluster.node.signal_container(cluster.pod_uid(pod), SIDECAR, fault)
    try:
        margin = stopped_before_expiry(work, expiry, f"the run ({fault.name} sidecar)")
    finally:
        if fault is signal.SIGSTOP:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    print(f"{fault.name} sidecar (signal) run stopped {margin:.1f}s before its Lease expired")
    next_run_goes_ahead(cluster, name, expiry + SKEW)


@pytest.mark.timeout(300)
def test_a_lost_kubelet_leaves_the_run_holding_its_lock_and_nothing_overlaps(
    cluster: Scenario,
) -> None:
    # The kubelet dies; the containers go on under containerd and the sidecar keeps
    # renewing: the run is alive, so the lock stays its own and a contender skips.
    work, pod, _ = hold_then(cluster, "ingest", ttl=TTL)
    cluster.node.stop_kubelet()
    try:
        # Longer than TTL + skew, checked throughout: a holder that stopped renewing would
        # lose its lock, or its work, within the window.
        holds(
            lambda: (
                work.running
                and (cluster.lease("ingest")["spec"].get("holderIdentity") or "").startswith(pod)
            ),
            TTL_SECONDS + SKEW + 3,
            "the run, its kubelet gone, working and holding its lock",
            every=1.0,
        )
    finally:
        cluster.node.start_kubelet()
    cluster.run("ingest", "ingest-2", "echo must not run")
    assert cluster.gate_exit("ingest-2") == EXIT_SKIPPED
    assert f"held by {pod}" in cluster.sidecar_log("ingest-2")
    assert overlapping(cluster.namespace_works()) == []
    assert work.running


@pytest.mark.timeout(240)
def test_wait_policy_runs_after_the_holder_on_the_real_node(cluster: Scenario) -> None:
    cluster.cronjob("queue", f"echo working; {UNTIL_FINISHED}", policy="wait", wait_timeout="60s")
    cluster.run("queue", "queue-1")
    first = cluster.main_running("queue-1")
    cluster.run("queue", "queue-2", "echo working; sleep 2")
    # The path the test names: queue-2 found the lock held and waited (its own line), and
    # queue-1 ends only then, however long queue-2's pod took to start.
    wait_for(lambda: "; waiting up to" in cluster.sidecar_log("queue-2"), 90, "queue-2 to wait")
    assert f"held by {first.pod}" in cluster.sidecar_log("queue-2")
    assert first.running
    cluster.finish(first)
    assert cluster.gate_exit("queue-2") == 0, "the waiting run went ahead once the lock was free"
    second = cluster.main_running("queue-2")
    assert first.stopped is not None
    assert first.stopped <= second.started
    assert cluster.main_finished("queue-2") == 0
    assert overlapping(cluster.namespace_works()) == []
    assert cluster.events("queue", "Skipped") == []
