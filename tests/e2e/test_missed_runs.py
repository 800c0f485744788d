"""Missed and failing runs on the real node, with the real CronJob controller ticking.

Four guarded CronJobs every minute (`startingDeadlineSeconds: 20`, `alert-after-missed:
2`): one whose runs work, one left suspended, one whose image cannot be pulled, one whose
runs always fail. The CronJob controller (kube-controller-manager) is then stopped across
a tick, past that deadline. The operator must warn `Missed` for that tick and for the
suspended CronJob's ticks, and `NotSucceeding` for the three that never succeed, and not
for the one whose runs work.
"""

from __future__ import annotations

import copy
import datetime
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.scenario import Scenario, seconds_to_next_minute
from tests.support.controlplane import ControlPlane
from tests.support.kube import holds, wait_for
from tests.support.processes import ControlPlaneProcesses

CRONLOCK = Path(sys.executable).with_name("cronlock")
DEADLINE = 20  # startingDeadlineSeconds of every CronJob here


def guarded(cluster: Scenario, name: str, script: str, **spec: Any) -> None:
    """A CronJob ticking every minute, created through the API and injected."""
    cluster.cronjob(name, script, alert_after_missed="2")
    body = copy.deepcopy(cluster.read_cronjob(name))
    patch: dict[str, Any] = {
        "spec": {"schedule": "* * * * *", "startingDeadlineSeconds": DEADLINE, **spec}
    }
    if "image" in spec:
        image = patch["spec"].pop("image")
        containers = body["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
        main = next(c for c in containers if c["name"] == "main")
        main.update(image=image, imagePullPolicy="Always")
        patch["spec"]["jobTemplate"] = body["spec"]["jobTemplate"]
    cluster.batch.patch_namespaced_cron_job(name, cluster.namespace, patch)


def tick_at(moment: float) -> str:
    return datetime.datetime.fromtimestamp(moment, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.timeout(600)  # up to four ticks of a minute, one of them missed
def test_missed_ticks_and_runs_that_never_succeed_are_warned(
    cluster: Scenario, controlplane: ControlPlane
) -> None:
    assert controlplane.env_dir is not None
    components = ControlPlaneProcesses(controlplane.env_dir, controlplane.env)
    # Created early in a minute, so that the first tick comes after every CronJob exists.
    if seconds_to_next_minute() < 25:
        time.sleep(seconds_to_next_minute() + 1)
    guarded(cluster, "works", "echo working")
    guarded(cluster, "paused", "echo working", suspend=True)
    guarded(cluster, "no-image", "echo working", image="cronlock.invalid/missing:1")
    guarded(cluster, "fails", "echo failing; exit 1")

    # The first tick runs "works" to success.
    wait_for(
        lambda: (cluster.read_cronjob("works").get("status") or {}).get("lastSuccessfulTime"),
        150,
        "the first run of works to succeed",
    )
    # The CronJob controller stopped from before the next tick until past its deadline.
    time.sleep(max(0.0, seconds_to_next_minute() - 5))
    tick = float(math.ceil(time.time() / 60) * 60)  # the next whole minute
    components.pause("kube-controller-manager")
    try:
        time.sleep(tick + DEADLINE + 8 - time.time())
    finally:
        components.resume("kube-controller-manager")

    [(kind, message)] = cluster.wait_event("works", "Missed", timeout=60)
    assert kind == "Warning"
    assert f"no run started for the tick at {tick_at(tick)} within {DEADLINE + 1}s" in message
    (kind, message), *_ = cluster.wait_event("paused", "Missed", timeout=60)
    assert "spec.suspend is true" in message
    for name in ("paused", "no-image", "fails"):
        (kind, message), *_ = cluster.wait_event(name, "NotSucceeding", timeout=120)
        assert kind == "Warning"
        assert message.startswith("no run succeeded for 2 ticks of the schedule '* * * * *'")
        assert f"-l cronlock.io/lock={name}" in message
    # Judged at the same ticks, "works" (one success, then one missed tick) is not: one
    # tick without success is under alert-after-missed. (No third tick is waited for: that
    # the CronJob controller ticks again once resumed is the controller's, not cronlock's.)
    holds(
        lambda: cluster.events("works", "NotSucceeding") == [],
        5,
        "works (a success, then one missed tick) has no NotSucceeding",
    )
    assert len(cluster.events("paused", "Missed")) == 1, "suspended: one Warning, not one a tick"

    status = subprocess.run(
        [str(CRONLOCK), "status", "-n", cluster.namespace, "-o", "json"],
        env=controlplane.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 1, status.stdout + status.stderr  # not succeeding: attention
    rows = {row["cronjob"]: row for row in json.loads(status.stdout)["items"]}
    assert rows["works"]["lastSuccessfulTime"] is not None
    assert rows["works"]["nextScheduleTime"] > tick_at(time.time())
    assert not [p for p in rows["works"]["problems"] if "no run succeeded" in p]
    assert any("no run succeeded for 2 ticks" in p for p in rows["fails"]["problems"])
