"""Jitter on the real node: a tick's Job of a CronJob annotated `cronlock.io/jitter` takes its
lock, and starts its work, at the instant its sidecar names (the tick's nominal time plus
the tick's offset), never before it; the sidecar says so in one line."""

from __future__ import annotations

import datetime
import re
import time

import pytest

from cronlock_sidecar.lock.jitter import tick_offset
from tests.e2e.scenario import Scenario

JITTER = 600.0  # 10m: past ticks of the last ten minutes can still lie ahead
LINE = re.compile(r"jitter: the run starts in ([0-9.]+)s, at (\S+)Z \(tick (\S+) of (\S+), ")


def ahead(now: float, low: float, high: float) -> tuple[str, int, float]:
    """A CronJob name and a tick of the last ten minutes whose instant (nominal + offset)
    is `low` to `high` seconds after `now`: the Job (named as the CronJob controller names a
    tick's) then has a pod that starts late and still waits, without the test waiting for
    the next minute."""
    minutes = int(now) // 60
    for index in range(2000):
        name = f"spread-{index}"
        for back in range(10):
            tick = minutes - back
            at = datetime.datetime.fromtimestamp(tick * 60, datetime.UTC)
            instant = tick * 60 + tick_offset(name, at, JITTER)
            if now + low <= instant <= now + high:
                return name, tick, instant
    raise AssertionError("no CronJob name's tick lies ahead within the window")


@pytest.mark.timeout(120)
def test_a_ticks_work_starts_at_the_instant_the_sidecar_names_never_before(
    cluster: Scenario,
) -> None:
    name, minutes, instant = ahead(time.time(), 8, 12)
    cluster.cronjob(name, "sleep 2", jitter="10m")
    job = f"{name}-{minutes}"
    cluster.run(name, job)
    work = cluster.main_running(job, timeout=40)
    # The tracker's clock is this host's monotonic one; the pod's wall clock is this host's.
    started = work.started + (time.time() - time.monotonic())
    acquired = cluster.lease(name)["spec"]["acquireTime"]
    assert cluster.main_finished(job) == 0

    found = LINE.search(cluster.sidecar_log(job))
    assert found is not None, cluster.sidecar_log(job)
    waited, stated, tick, cronjob = found.groups()
    tick_at = datetime.datetime.fromtimestamp(minutes * 60, datetime.UTC)
    assert (tick, cronjob) == (tick_at.strftime("%Y-%m-%dT%H:%M:%SZ"), name)
    stated_at = datetime.datetime.fromisoformat(stated + "+00:00").timestamp()
    assert stated_at == pytest.approx(instant, abs=0.001)
    assert float(waited) > 1, "the sidecar started after the instant: nothing was measured"
    # Neither the lock nor the work before the instant; the work within 2.5s after it (the
    # gate polls every 0.1s by then, and the work's container starts: 1.1s measured).
    lock_taken = datetime.datetime.fromisoformat(str(acquired).replace("Z", "+00:00"))
    assert lock_taken.timestamp() >= stated_at - 0.001
    assert stated_at <= started <= stated_at + 2.5, (started - stated_at, waited)
    late = lock_taken.timestamp() - stated_at
    print(
        f"jitter e2e: sidecar waited {waited}s; lock taken {late:.3f}s and work started "
        f"{started - stated_at:.3f}s after the stated instant"
    )
