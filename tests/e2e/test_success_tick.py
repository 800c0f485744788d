"""The last successful tick on the real node (issue 56 item 3): a tick's Job whose work
succeeds is recorded by the operator as the lock's last success; a failed tick's Job does
not move it; the next tick's work reads it in tick.env beside the previous tick."""

from __future__ import annotations

import datetime
import time

import pytest

from tests.e2e.scenario import MAIN, Scenario
from tests.support.kube import wait_for

SUCCEEDED = "cronlock.io/succeeded.nightly"


def tick_text(minutes: int) -> str:
    return datetime.datetime.fromtimestamp(minutes * 60, datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


@pytest.mark.timeout(300)
def test_the_next_ticks_work_reads_the_last_successful_tick_not_a_failed_one(
    cluster: Scenario,
) -> None:
    cluster.cronjob("nightly", "cat /var/run/cronlock/tick.env")
    now = int(time.time()) // 60
    # Three ticks the CronJob controller would name so, the newest this minute's.
    worked, failed, latest = (f"nightly-{now - 2}", f"nightly-{now - 1}", f"nightly-{now}")

    def success() -> str:
        notes = cluster.lease("nightly")["metadata"].get("annotations") or {}
        return str(notes.get(SUCCEEDED, ""))

    cluster.run("nightly", worked)
    assert cluster.main_finished(worked) == 0
    uid = str(cluster.job(worked)["metadata"]["uid"])  # type: ignore[index]
    recorded = wait_for(success, 60, "the operator to record the successful tick")
    assert recorded.split(" ")[:3] == [tick_text(now - 2), worked, uid]

    cluster.run("nightly", failed, "cat /var/run/cronlock/tick.env; exit 3")
    assert cluster.main_finished(failed) == 3
    wait_for(
        lambda: (
            "cronlock.io/accounted"
            in ((cluster.job(failed) or {}).get("metadata", {}).get("annotations") or {})
        ),
        60,
        "the operator to count the failed Job",
    )
    assert success() == recorded, "a failed tick does not move the last success"

    cluster.run("nightly", latest)
    assert cluster.main_finished(latest) == 0
    [pod] = cluster.pods(latest)
    log = cluster.core.read_namespaced_pod_log(
        pod["metadata"]["name"], cluster.namespace, container=MAIN
    )
    assert f"CRONLOCK_TICK={tick_text(now)}\n" in log
    assert f"CRONLOCK_PREVIOUS_TICK={tick_text(now - 1)}\n" in log
    assert f"CRONLOCK_LAST_SUCCESS_TICK={tick_text(now - 2)}\n" in log
    moved = wait_for(
        lambda: s if (s := success()).startswith(tick_text(now)) else None,
        60,
        "the success record to move to the latest tick",
    )
    assert moved.split(" ")[1] == latest
