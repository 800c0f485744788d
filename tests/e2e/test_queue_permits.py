"""policy: queue on a lock of two permits, on the real node: two queued runs work at once,
never three; the rest wait as suspended Jobs with no pod and go in creation order as
permits free (docs/USAGE.md, "Queue instead of skip")."""

from __future__ import annotations

import pytest

from tests.e2e.scenario import Scenario
from tests.support.kube import wait_for
from tests.support.node import crowded

RUNS = ("two-1", "two-2", "two-3", "two-4")


@pytest.mark.timeout(150)
def test_two_permits_let_two_queued_runs_work_at_once_and_the_rest_wait_without_pods(
    cluster: Scenario,
) -> None:
    cluster.cronjob("two", "echo working; sleep 6", policy="queue", permits="2")
    cluster.run("two", RUNS[0])
    cluster.run("two", RUNS[1])
    cluster.main_running(RUNS[0])
    cluster.main_running(RUNS[1])
    for job in RUNS[2:]:
        cluster.run("two", job)
    # Both permits held: the later two are queued, suspended, with no pod.
    for job in RUNS[2:]:
        assert (cluster.job(job) or {}).get("spec", {}).get("suspend") is True, job
        assert cluster.pods(job) == [], job

    works = [wait_for(lambda j=job: cluster.works(j), 90, f"the work of {job}")[0] for job in RUNS]
    wait_for(lambda: all(work.stopped for work in cluster.namespace_works()), 40, "works to end")
    done = cluster.namespace_works()
    assert len(done) == len(RUNS), [work.pod for work in done]
    assert [len(cluster.works(job)) for job in RUNS] == [1] * len(RUNS), "a run worked twice"
    assert crowded(done, 2) == [], "more than two works at once"
    assert crowded(done, 1) != [], "two permits, yet no two works ever ran at once"
    # The queued two were let go in creation order (the Job controller's startTime, whole
    # seconds): two let go in one reconcile start their pods in either order, so the order
    # kept is the letting go, not the pods' start. Each worked after a permit freed.
    started = [str((cluster.job(job) or {}).get("status", {}).get("startTime")) for job in RUNS[2:]]
    assert "None" not in started, started
    assert started[0] <= started[1], started
    first_end = min(work.stopped for work in works[:2] if work.stopped is not None)
    assert all(work.started >= first_end for work in works[2:]), "a queued run worked early"
    assert len(cluster.wait_event("two", "Dequeued", count=len(RUNS))) == len(RUNS)
