"""cronlock.io/max-hold on the real node: a hung run is stopped within its bound plus one
renew period of its acquire, keeps its Lease until its pod has ended, then gives it back;
the operator posts `MaxHoldExceeded`, and the next run takes the lock.

The work's stop is the tracker's (the kernel closes the main container's connection when
its processes die); the acquire is the Lease's acquireTime, and the release its
`released-at`, both on this host's clock, which the node shares.
"""

from __future__ import annotations

import datetime
import time

import pytest

from tests.e2e.scenario import Scenario
from tests.support.kube import wait_for
from tests.support.node import overlapping

TTL = "19s"  # the shortest the operator admits at the default skew
RENEW_SECONDS = 5.0
BOUND_SECONDS = 10.0  # the shortest max-hold that renew allows: two renew periods


def on_this_host(stamp: str) -> float:
    """A Lease's RFC 3339 time as this host's monotonic clock reads it."""
    at = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return time.monotonic() - (time.time() - at)


KILL_GRACE_SECONDS = 2.0  # what the operator picks for ttl 19s at the default skew


@pytest.mark.parametrize("stop", ["liveness", "signal"])
def test_a_hung_run_is_stopped_at_its_max_hold_and_the_next_run_takes_the_lock(
    cluster: Scenario, stop: str
) -> None:
    """liveness, the pod's default: the kubelet's probe fails and it kills the container;
    sh, its PID 1, ignores SIGTERM, so the grace's SIGKILL ends it. signal: the sidecar's
    watchdog signals every process of the work, which ignores SIGTERM: a second tracker
    connection, held by processes that inherit the ignored SIGTERM, closes only at the
    SIGKILL after the kill grace."""
    name = f"hung-{stop}"
    work = "echo hung; sleep 3600"
    if stop == "signal":
        work = f"trap '' TERM; {cluster.tracker.shell_prefix()}sleep 3600 & wait; sleep 3600"
    cluster.cronjob(
        name, work, ttl=TTL, renew=f"{RENEW_SECONDS:g}s", max_hold=f"{BOUND_SECONDS:g}s", stop=stop
    )
    cluster.run(name, f"{name}-1")
    running = cluster.main_running(f"{name}-1")
    lease = cluster.lease(name)
    assert lease["spec"]["holderIdentity"].startswith(running.pod)
    acquired = on_this_host(lease["spec"]["acquireTime"])

    def all_stopped() -> float | None:
        works = cluster.works(f"{name}-1")
        ends = [work.stopped for work in works]
        return None if None in ends else max(end for end in ends if end is not None)

    stopped = wait_for(all_stopped, BOUND_SECONDS + 60, "every process of the hung work to stop")
    held = stopped - acquired
    print(
        f"{stop}: stopped {held:.1f}s after its acquire (bound {BOUND_SECONDS:g}s, renew "
        f"{RENEW_SECONDS:g}s)"
    )
    assert held >= BOUND_SECONDS, f"stopped {BOUND_SECONDS - held:.1f}s before its bound"
    if stop == "signal":
        assert held >= BOUND_SECONDS + KILL_GRACE_SECONDS - 0.5, "SIGTERM alone ended it"
        assert len(cluster.works(f"{name}-1")) == 2
    assert held <= BOUND_SECONDS + RENEW_SECONDS, (
        f"stopped {held - BOUND_SECONDS:.1f}s after its bound, more than one renew period"
    )

    # Given back once the pod ended, not before: no second run while this one was stopping.
    released = wait_for(lambda: spec_released(cluster, name), 60, f"lock {name} to be released")
    assert released["cronlock.io/last-holder"].startswith(running.pod)
    assert on_this_host(released["cronlock.io/released-at"]) >= stopped - 0.5
    assert "max-hold exceeded: held 1" in cluster.sidecar_log(f"{name}-1")

    [(kind, message)] = cluster.wait_event(name, "MaxHoldExceeded", timeout=60)
    assert kind == "Warning"
    assert f"run {name}-1 held lock {name} past cronlock.io/max-hold" in message
    assert f"bound {BOUND_SECONDS:g}s" in message

    # The lock is free: the next run goes ahead at once, and no two pods' works overlapped
    # (the signal run's two connections are one pod's).
    cluster.run(name, f"{name}-2", "echo working again")
    assert cluster.gate_exit(f"{name}-2") == 0
    assert cluster.main_finished(f"{name}-2") == 0
    pairs = overlapping(cluster.namespace_works())
    assert [(a.pod, b.pod) for a, b in pairs if a.pod != b.pod] == []


def spec_released(cluster: Scenario, lock: str) -> dict[str, str] | None:
    """The Lease's annotations once it has no holder, else None."""
    lease = cluster.lease(lock)
    if lease["spec"].get("holderIdentity"):
        return None
    annotations: dict[str, str] = lease["metadata"].get("annotations") or {}
    return annotations if "cronlock.io/released-at" in annotations else None
