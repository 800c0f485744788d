"""The replace and observe policies on the real node: what each run's pod and Job do."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from tests.e2e.scenario import SIDECAR, UNTIL_FINISHED, Scenario
from tests.support.contract import EXIT_SKIPPED
from tests.support.kube import wait_for
from tests.support.node import overlapping


def test_replace_stops_the_old_run_before_the_new_one_starts_and_the_old_job_ends_failed(
    cluster: Scenario,
) -> None:
    # backoffLimit 2: the replaced run's Job would retry; its retry must skip, not replace.
    cluster.cronjob("newest", "echo working; sleep 300", policy="replace", backoff_limit=2)

    cluster.run("newest", "newest-1")
    first = cluster.main_running("newest-1")
    asked_at = time.monotonic()
    cluster.run("newest", "newest-2")
    second = cluster.main_running("newest-2", timeout=60)

    assert first.stopped is not None, "the old run's work was stopped"
    assert first.stopped <= second.started, (first, second)
    print(
        f"replace: the old work stopped {first.stopped - asked_at:.1f}s after the new run "
        f"was created, the new work started {second.started - first.stopped:.1f}s after that"
    )
    assert overlapping(cluster.namespace_works()) == []
    assert "asked it to yield to newest-2-" in cluster.sidecar_log("newest-2")
    assert "replaced by newest-2-" in cluster.sidecar_log("newest-1")
    (kind, message), *_ = cluster.wait_event("newest", "Replaced")
    assert kind == "Normal"
    assert message.startswith("run newest-1 was stopped and gave up lease ")
    assert "replaced by newest-2-" in message
    assert cluster.lease("newest")["spec"]["holderIdentity"].startswith("newest-2-")

    # The old Job: its pod was stopped as a lost run is; its retry skips at the gate
    # (FailJob), so the Job ends Failed and is kept, marked as replaced.
    wait_for(lambda: cluster.job_condition("newest-1") == "Failed", 90, "newest-1 to fail")
    pods = cluster.pods("newest-1")
    assert len(pods) == 2, [pod["metadata"]["name"] for pod in pods]
    assert cluster.gate_exit("newest-1", pod=pods[-1]["metadata"]["name"]) == EXIT_SKIPPED
    assert "this Job's run was replaced by newest-2-" in cluster.sidecar_log("newest-1")
    assert [work.pod for work in cluster.works("newest-1")] == [pods[0]["metadata"]["name"]]
    # The operator counts the failed Job after the Job controller fails it: wait for that
    # (read at once, the mark was not there yet in one full run).
    job = wait_for(
        lambda: (
            found
            if "cronlock.io/accounted"
            in (
                (found := cluster.job("newest-1") or {}).get("metadata", {}).get("annotations")
                or {}
            )
            else None
        ),
        60,
        "the operator to count the replaced Job",
    )
    assert job, "a replaced Job is kept, unlike a skipped one"
    marks = job["metadata"]["annotations"]
    assert marks["cronlock.io/replaced-by"].startswith("newest-2-")
    assert marks["cronlock.io/accounted"] == "replaced"
    assert job["metadata"]["labels"]["cronlock.io/outcome"] == "replaced"
    assert cluster.consecutive_skips("newest") == 0
    assert second.running, "the replacing run goes on"


@pytest.mark.timeout(240)
def test_replace_waits_for_a_frozen_holders_lease_to_expire_and_never_overlaps(
    cluster: Scenario,
) -> None:
    """A holder that cannot read the request (its sidecar frozen) never yields: the probe
    stops its run, and the replace run starts only after the Lease expired."""
    cluster.cronjob("frozen", "echo working; sleep 300", policy="replace")
    cluster.run("frozen", "frozen-1")
    first = cluster.main_running("frozen-1")
    expiry = cluster.wait_renewal("frozen")
    pid = cluster.node.signal_container(cluster.pod_uid(first.pod), SIDECAR, signal.SIGSTOP)
    try:
        cluster.run("frozen", "frozen-2")
        second = cluster.main_running("frozen-2", timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)

    assert first.stopped is not None
    assert first.stopped < expiry, "the frozen holder's run was stopped before its Lease expired"
    assert second.started > expiry, "the replace run waited for the Lease to expire"
    assert overlapping(cluster.namespace_works()) == []
    assert "asked it to yield to frozen-2-" in cluster.sidecar_log("frozen-2")
    assert cluster.events("frozen", "Replaced") == [], "a frozen holder never yielded"
    print(
        f"frozen holder: its run stopped {expiry - first.stopped:.1f}s before its Lease "
        f"expired; the replace run started {second.started - expiry:.1f}s after it"
    )


def test_observe_runs_every_run_and_records_each_overlap(cluster: Scenario) -> None:
    cluster.cronjob(
        "observed", f"echo working; {UNTIL_FINISHED}", policy="observe", alert_after="2"
    )

    cluster.run("observed", "observed-1")
    first = cluster.main_running("observed-1")
    cluster.run("observed", "observed-2", "echo quick; sleep 3")
    second = cluster.main_running("observed-2", timeout=60)

    assert first.running, "observe never stops or skips a run"
    assert overlapping(cluster.namespace_works()) == [(first, second)]
    log = cluster.sidecar_log("observed-2")
    assert f"overlap: lease {cluster.namespace}/cronlock-observed held by observed-1-" in log
    assert "(observe policy: running anyway)" in log
    (kind, message), *_ = cluster.wait_event("observed", "Overlap")
    assert kind == "Warning"
    assert message.startswith(f"run observed-2 started while lease {cluster.namespace}/")
    lease = cluster.lease("observed")
    assert lease["spec"]["holderIdentity"].startswith("observed-1-"), "observe took it when free"
    assert lease["metadata"]["annotations"]["cronlock.io/overlap"].startswith("observed-2-")
    assert cluster.main_finished("observed-2", timeout=60) == 0
    wait_for(lambda: cluster.job_condition("observed-2") == "Complete", 30, "observed-2 complete")
    wait_for(lambda: cluster.consecutive_skips("observed") == 1, 30, "the overlap counted")
    marked = cluster.job("observed-2")
    assert marked is not None, "an overlapped run's Job is kept"
    assert marked["metadata"]["annotations"]["cronlock.io/overlapped"].startswith("observed-1-")

    # A second overlap in a row reaches alert-after 2: RepeatedSkips says so.
    cluster.run("observed", "observed-3", "echo quick")
    assert cluster.main_finished("observed-3", timeout=60) == 0
    (kind, message), *_ = cluster.wait_event("observed", "RepeatedSkips", timeout=60)
    assert kind == "Warning"
    assert message.startswith("2 runs in a row overlapped a run holding lock observed")
    assert first.running, "still: the first run was never disturbed"

    # The first run ends as it would without cronlock, and its success resets the count.
    cluster.finish(first)
    assert cluster.main_finished("observed-1", timeout=60) == 0
    wait_for(lambda: cluster.consecutive_skips("observed") == 0, 30, "the success counted")
    assert len(cluster.events("observed", "Overlap")) == 2
