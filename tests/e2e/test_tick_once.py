"""Each tick at most once, on the real node: a tick's Job runs and its work reads the tick;
another Job of the same tick (the first deleted and made again with the same name from the
CronJob) skips with exit 75 and the gate's termination message says who worked it."""

from __future__ import annotations

import datetime
import time

import kubernetes
import pytest

from tests.e2e.scenario import GATE, MAIN, Scenario
from tests.support.contract import EXIT_SKIPPED
from tests.support.kube import wait_for
from tests.support.node import container_state


@pytest.mark.timeout(180)
def test_a_second_job_of_a_worked_tick_skips_and_says_which_run_worked_it(
    cluster: Scenario,
) -> None:
    cluster.cronjob("nightly", "cat /var/run/cronlock/tick.env")
    minutes = int(time.time()) // 60
    job = f"nightly-{minutes}"  # the CronJob controller's name for this minute's tick
    tick = datetime.datetime.fromtimestamp(minutes * 60, datetime.UTC)
    tick_text = tick.strftime("%Y-%m-%dT%H:%M:%SZ")

    cluster.run("nightly", job)
    assert cluster.main_finished(job) == 0
    [first] = cluster.pods(job)
    first_name = first["metadata"]["name"]
    log = cluster.core.read_namespaced_pod_log(first_name, cluster.namespace, container=MAIN)
    assert f"CRONLOCK_TICK={tick_text}\n" in log
    assert "CRONLOCK_MANUAL=false\n" in log
    first_uid = str(cluster.job(job)["metadata"]["uid"])  # type: ignore[index]

    # The same tick again: the Job deleted once it finished, and made again by its name.
    cluster.batch.delete_namespaced_job(
        job,
        cluster.namespace,
        body=kubernetes.client.V1DeleteOptions(propagation_policy="Background"),
    )
    wait_for(lambda: cluster.job(job) is None, 30, f"Job {job} to be deleted")
    cluster.run("nightly", job)
    second_uid = wait_for(
        lambda: (found := cluster.job(job)) and found["metadata"]["uid"], 30, f"Job {job} again"
    )
    assert second_uid != first_uid
    second_pod = wait_for(
        lambda: next(
            (
                p["metadata"]["name"]
                for p in cluster.pods(job)
                if p["metadata"]["name"] != first_name
            ),
            None,
        ),
        60,
        "the second Job's pod",
    )
    assert cluster.gate_exit(job, pod=second_pod) == EXIT_SKIPPED
    [seen] = [p for p in cluster.pods(job) if p["metadata"]["name"] == second_pod]
    message = container_state(seen, GATE)["terminated"].get("message", "")
    assert message.startswith(f"already ran: tick {tick_text} of nightly on lock "), message
    assert f"claimed by job {job} (run {first_uid}, holder {first_name}_" in message
    assert [w for w in cluster.works(job) if w.pod == second_pod] == [], "its work never ran"
    record = cluster.lease("nightly")["metadata"]["annotations"]["cronlock.io/tick.nightly"]
    assert record.split(" ")[:3] == [tick_text, job, first_uid]
