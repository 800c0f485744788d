"""`cronlock status` on a real API server, for a lock of N permits: a row per held permit."""

from __future__ import annotations

import datetime
import json

import kubernetes
import pytest

from cronlock_sidecar.lock import permits
from cronlock_sidecar.lock.model import Timing
from tests.integration.test_status import EVERY_FIVE_MINUTES, cronlock, table
from tests.support import gen
from tests.support.controlplane import ControlPlane
from tests.support.leases import make_lease

pytestmark = pytest.mark.controlplane

SPEC_HOLDER = "report-29123456-x7k2p_4f0e9a1c"
ENTRY_HOLDER = "export-29123457-b8c9d_5a6b7c8d"
GONE_HOLDER = "export-29000000-q1w2e_77aa0bb1"


def test_each_held_permit_of_a_lock_is_a_row_and_an_expired_one_is_a_problem(
    api: kubernetes.client.ApiClient, controlplane: ControlPlane, namespace: str
) -> None:
    batch = kubernetes.client.BatchV1Api(api)
    shared = {"cronlock.io/lock": "reports", "cronlock.io/permits": "3"}
    for name in ("report", "export"):
        batch.create_namespaced_cron_job(
            namespace, gen.cronjob(name, *EVERY_FIVE_MINUTES, gen.annotated(shared))
        )
    now = datetime.datetime.now(datetime.UTC)
    lease = make_lease(
        SPEC_HOLDER,
        lock="reports",
        namespace=namespace,
        renewed=now,
        duration=30,
        annotations={"cronlock.io/permits": "3"},
    )
    lease = permits.claimed_permit(lease, 1, ENTRY_HOLDER, Timing.of(30), now, "export-29123457")
    stale = now - datetime.timedelta(hours=1)
    lease = permits.claimed_permit(lease, 2, GONE_HOLDER, Timing.of(30), stale, "export-29000000")
    kubernetes.client.CoordinationV1Api(api).create_namespaced_lease(namespace, lease)

    listed = cronlock(controlplane, "status", "-n", namespace, "-o", "json")
    assert listed.returncode == 1, listed.stderr  # the expired permit is a problem
    items = json.loads(listed.stdout)["items"]
    assert [(i["cronjob"], i["permit"], i["holder"], i["state"]) for i in items] == [
        ("export", 0, SPEC_HOLDER, "held"),
        ("export", 1, ENTRY_HOLDER, "held"),
        ("export", 2, GONE_HOLDER, "expired"),
        ("report", 0, SPEC_HOLDER, "held"),
        ("report", 1, ENTRY_HOLDER, "held"),
        ("report", 2, GONE_HOLDER, "expired"),
    ]
    assert {item["permits"] for item in items} == {3}
    [warned] = {line for line in listed.stderr.splitlines() if "permit 2" in line}
    assert warned.startswith(f"cronlock: warning: lease {namespace}/cronlock-reports permit 2 ")
    assert warned.endswith(f"ago but is still held by {GONE_HOLDER}")

    shown = cronlock(controlplane, "status", "-n", namespace, columns=200)
    lines = shown.stdout.splitlines()
    assert lines[0].split()[:3] == ["CRONJOB", "LOCK", "HOLDER"]
    rows = [table(line)[line.split()[0]] for line in lines[1:]]
    assert [row[1:3] for row in rows[:3]] == [
        ["reports#0", SPEC_HOLDER],
        ["reports#1", ENTRY_HOLDER],
        ["reports#2", GONE_HOLDER],
    ]
    named = cronlock(controlplane, "status", "-n", namespace, "-o", "name")
    assert named.stdout.split() == ["cronjob.batch/export", "cronjob.batch/report"]
