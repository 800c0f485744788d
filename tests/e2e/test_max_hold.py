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

from tests.e2e.scenario import Scenario, next_run_goes_ahead
from tests.support.kube import wait_for
from tests.support.node import overlapping

TTL = "19s"  # the shortest the operator admits at the default skew
RENEW_SECONDS = 5.0
BOUND_SECONDS = 10.0  # the shortest max-hold that renew allows: two renew periods


def on_this_host(stamp: str) -> float:
    """A Lease's RFC 3339 time as this host's monotonic clock reads it."""
    at = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return time.monotonic() - (time.time() - at)


@pytest.mark.parametrize(
    ("stop", "work"),
    [
        # The pod's default: the kubelet's liveness probe fails; sh as its container's PID 1
        # ignores SIGTERM, so the kill grace's SIGKILL ends it.
        ("liveness", "echo hung; sleep 3600"),
        # The sidecar's watchdog signals the work, which ignores SIGTERM (and so does its
        # child): SIGKILL after the kill grace.
        ("signal", "trap '' TERM; echo hung; sleep 3600 & wait; sleep 3600"),
    ],
)
def test_a_hung_run_is_stopped_at_its_max_hold_and_the_next_run_takes_the_lock(
    cluster: Scenario, stop: str, work: str
) -> None:
    name = f"hung-{stop}"
    cluster.cronjob(
        name, work, ttl=TTL, renew=f"{RENEW_SECONDS:g}s", max_hold=f"{BOUND_SECONDS:g}s", stop=stop
    )
    cluster.run(name, f"{name}-1")
    running = cluster.main_running(f"{name}-1")
    lease = cluster.lease(name)
    assert lease["spec"]["holderIdentity"].startswith(running.pod)
    acquired = on_this_host(lease["spec"]["acquireTime"])

    stopped = wait_for(lambda: running.stopped, BOUND_SECONDS + 60, "the hung work to stop")
    held = stopped - acquired
    print(
        f"{stop}: stopped {held:.1f}s after its acquire (bound {BOUND_SECONDS:g}s, renew "
        f"{RENEW_SECONDS:g}s)"
    )
    assert held >= BOUND_SECONDS, f"stopped {BOUND_SECONDS - held:.1f}s before its bound"
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

    next_run_goes_ahead(cluster, name, not_before=time.monotonic())
    assert overlapping(cluster.namespace_works()) == []


def spec_released(cluster: Scenario, lock: str) -> dict[str, str] | None:
    """The Lease's annotations once it has no holder, else None."""
    lease = cluster.lease(lock)
    if lease["spec"].get("holderIdentity"):
        return None
    annotations: dict[str, str] = lease["metadata"].get("annotations") or {}
    return annotations if "cronlock.io/released-at" in annotations else None
