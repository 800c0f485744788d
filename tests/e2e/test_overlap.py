"""A run that starts while another holds the lock is skipped; the next one goes ahead."""

from __future__ import annotations

import pytest

from tests.e2e.scenario import UNTIL_FINISHED, Scenario, seconds_to_next_minute
from tests.support.contract import EXIT_SKIPPED
from tests.support.kube import wait_for
from tests.support.node import overlapping


def test_a_manual_run_during_a_run_is_skipped_and_the_run_after_it_goes_ahead(
    cluster: Scenario,
) -> None:
    cluster.cronjob("report", f"echo building; {UNTIL_FINISHED}", backoff_limit=2)

    cluster.run("report", "report-1")
    first = cluster.main_running("report-1")
    cluster.run("report", "report-2")

    assert cluster.gate_exit("report-2") == EXIT_SKIPPED
    line = f"already running: lease {cluster.namespace}/cronlock-report held by report-1-"
    assert line in cluster.sidecar_log("report-2")
    assert "skipping this run" in cluster.sidecar_log("report-2")
    assert cluster.works("report-2") == [], "a skipped run never starts its work"
    (kind, message), *_ = cluster.wait_event("report", "Skipped")
    assert kind == "Normal"
    assert message.startswith("run report-2 skipped: lock report was held by another run")
    wait_for(lambda: cluster.job("report-2") is None, 30, "the operator to delete report-2")
    # FailJob, not the backoffLimit of 2: the skipped Job never made a second pod.
    assert len(cluster.pods("report-2")) == 1
    assert first.running, "the skip did not disturb the run in progress"

    cluster.finish(first)  # only now that report-2 has decided and been accounted for
    assert cluster.main_finished("report-1", timeout=60) == 0
    wait_for(lambda: cluster.job_condition("report-1") == "Complete", 30, "report-1 complete")
    lease = cluster.lease("report")
    assert not lease["spec"].get("holderIdentity"), "the finished run released the lock"
    assert lease["metadata"]["annotations"]["cronlock.io/last-holder"].startswith("report-1-")

    cluster.run("report", "report-3", "echo quick")
    assert cluster.gate_exit("report-3") == 0
    assert cluster.main_finished("report-3") == 0
    wait_for(lambda: cluster.job_condition("report-3") == "Complete", 30, "report-3 complete")
    assert overlapping(cluster.namespace_works()) == []
    assert cluster.consecutive_skips("report") == 0


@pytest.mark.timeout(240)
def test_a_scheduled_tick_during_a_run_is_skipped_and_the_next_tick_runs(
    cluster: Scenario,
) -> None:
    cluster.cronjob("minutely", "echo tick; sleep 2", schedule="* * * * *")

    def scheduled_jobs() -> set[str]:
        return cluster.jobs_seen() - {"minutely-manual"}

    # The manual run must take the lock well after one tick's short run and hold it over
    # the next tick.
    wait_for(lambda: 12 < seconds_to_next_minute() < 48, 40, "12s to 48s before a tick")
    wait_for(lambda: not cluster.lease("minutely")["spec"].get("holderIdentity"), 30, "a free lock")
    earlier = scheduled_jobs()
    cluster.run("minutely", "minutely-manual", f"echo holding; {UNTIL_FINISHED}")
    manual = cluster.main_running("minutely-manual")

    tick = min(wait_for(lambda: scheduled_jobs() - earlier, 75, "the CronJob's next tick"))

    assert cluster.gate_exit(tick) == EXIT_SKIPPED
    assert manual.running, "the tick came while the manual run worked"
    cluster.finish(manual)  # held until the tick's run decided, however late its pod started
    assert cluster.main_finished("minutely-manual") == 0
    (_, message), *_ = cluster.wait_event("minutely", "Skipped")
    assert message.startswith(f"run {tick} skipped")
    wait_for(lambda: cluster.job(tick) is None, 30, f"the operator to delete {tick}")
    assert "held by minutely-manual-" in cluster.sidecar_log(tick)

    following = min(wait_for(lambda: scheduled_jobs() - earlier - {tick}, 90, "the tick after"))
    assert cluster.gate_exit(following) == 0
    assert cluster.main_finished(following) == 0
    wait_for(lambda: cluster.job_condition(following) == "Complete", 30, f"{following} complete")
    assert overlapping(cluster.namespace_works()) == []
