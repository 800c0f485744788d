"""Two real nodes: a run on a node cut off from the API server, its kubelet alive, while a
run of the same lock waits on the other node (issue 25's partition, on real parts)."""

from __future__ import annotations

import datetime
import time

import pytest

from tests.e2e.scenario import MAIN, Scenario
from tests.support.kube import holds, wait_for
from tests.support.node import LeaseVersion, RealNode, overlapping
from tests.support.timing import liveness_verdict


def waiting(cluster: Scenario, job: str, holder: str) -> None:
    """`job`'s run found the lock held by `holder`'s and waits: the path the tests name,
    taken before the cut, while the holder still renews, however late its pod started."""
    wait_for(lambda: "; waiting up to" in cluster.sidecar_log(job), 120, f"{job} to wait")
    assert f"held by {holder}-" in cluster.sidecar_log(job)


def last_expiry(cluster: Scenario, lock: str, holder: str) -> tuple[str, float]:
    """The last renewal by `holder`'s run the API server stored (its renew time), and when
    that expires on this host's monotonic clock (every node here shares the host's clock),
    from the Lease's history once the watch has seen the Lease held by another run."""
    history = cluster.history
    assert history is not None, "the cluster fixture records every Lease version"

    def taken_over() -> list[LeaseVersion] | None:
        versions = history.versions(f"cronlock-{lock}")
        last = versions[-1].holder if versions else ""
        return versions if last and not last.startswith(f"{holder}-") else None

    versions = wait_for(taken_over, 30, f"the watch to see lock {lock} taken from {holder}")
    last = max(
        (v for v in versions if v.holder.startswith(f"{holder}-") and v.renew_time),
        key=lambda v: v.renew_time or 0.0,
    )
    assert last.renew_time is not None
    assert last.duration is not None
    renewed = datetime.datetime.fromtimestamp(last.renew_time, datetime.UTC).isoformat()
    return renewed, last.renew_time + last.duration - last.offset


@pytest.mark.timeout(300)
def test_a_run_on_a_partitioned_node_stops_before_its_lease_expires_and_the_waiting_run_goes(
    cluster: Scenario, second_node: RealNode
) -> None:
    cluster.cronjob(
        "far",
        "echo working; sleep 300",
        node=second_node.name,
        lock="ledger",
        share_lock_with="near",
    )
    cluster.cronjob(
        "near",
        "echo working; sleep 300",
        node=cluster.node.name,
        lock="ledger",
        policy="wait",
        wait_timeout="120s",
    )
    cluster.run("far", "far-1")
    far = cluster.main_running("far-1", timeout=120)
    cluster.run("near", "near-1")
    waiting(cluster, "near-1", "far-1")
    cluster.wait_renewal("ledger")

    with second_node.partitioned():
        partitioned_at = time.monotonic()
        near = cluster.main_running("near-1", timeout=120)
        renewed, expires = last_expiry(cluster, "ledger", "far-1")
        # The last renewal node 2 got through, from the Lease's history: none after the cut.
        assert far.stopped is not None, "the partitioned run's work was stopped"
        print(
            f"partition: node 2's work stopped {far.stopped - partitioned_at:.1f}s after the "
            f"cut, {expires - far.stopped:.1f}s before its Lease expired; node 1's work "
            f"started {near.started - far.stopped:.1f}s after it stopped"
        )
        assert far.stopped < expires, (far, expires, renewed)
        assert far.stopped <= near.started
        assert overlapping(cluster.namespace_works()) == []
    holder = cluster.lease("ledger")["spec"]["holderIdentity"]
    assert holder.startswith("near-1-"), holder


@pytest.mark.timeout(360)
@pytest.mark.parametrize("stop", ["signal", "liveness"])
def test_a_partitioned_node_whose_kubelet_is_dead_too(
    cluster: Scenario, second_node: RealNode, stop: str
) -> None:
    """Nothing on node 2 applies the liveness probe: only the sidecar's own signals
    (`stop: signal`) stop the work before its Lease expires. Under the default liveness
    mode the work runs on, and the run that waited on node 1 overlaps it until the
    kubelet is back: the window this test measures and docs/RELIABILITY.md records."""
    far, near = f"far-{stop}", f"near-{stop}"
    lock = f"ledger-{stop}"
    cluster.cronjob(
        far, "echo working; sleep 300", node=second_node.name, lock=lock,
        share_lock_with=near, stop=stop,
    )  # fmt: skip
    cluster.cronjob(
        near, "echo working; sleep 300", node=cluster.node.name, lock=lock,
        policy="wait", wait_timeout="120s",
    )  # fmt: skip
    cluster.run(far, f"{far}-1")
    work = cluster.main_running(f"{far}-1", timeout=120)
    cluster.run(near, f"{near}-1")
    waiting(cluster, f"{near}-1", f"{far}-1")
    cluster.wait_renewal(lock)
    second_node.stop_kubelet()
    try:
        with second_node.partitioned():
            cut_at = time.monotonic()
            waited = cluster.main_running(f"{near}-1", timeout=120)
            _, expires = last_expiry(cluster, lock, f"{far}-1")
            if stop == "signal":
                assert work.stopped is not None, "the sidecar's signals stopped the work"
                assert work.stopped < expires, (work, expires)
                assert work.stopped <= waited.started
                assert overlapping(cluster.namespace_works()) == []
                print(
                    f"partition + dead kubelet, stop: signal: work stopped "
                    f"{work.stopped - cut_at:.1f}s after the cut, "
                    f"{expires - work.stopped:.1f}s before its Lease expired"
                )
                return
            # stop: liveness: nothing on node 2 stops the work, not even as long after the
            # Lease expired as a kubelet would take to act on the failing probe.
            [probe] = [
                c["livenessProbe"]
                for c in cluster.pods(f"{far}-1")[-1]["spec"]["containers"]
                if c["name"] == MAIN
            ]
            holds(
                lambda: work.running,
                liveness_verdict(probe),
                "only a kubelet applies the probe; none runs on node 2",
            )
            assert waited.started >= expires, (waited, expires)
            assert overlapping(cluster.namespace_works()), "the documented overlap"
    finally:
        second_node.start_kubelet()
    # The kubelet is back (and the partition over): its probe finds the hold lost.
    wait_for(lambda: work.stopped is not None, 60, "the returned kubelet to stop the work")
    assert work.stopped is not None
    print(
        f"partition + dead kubelet, stop: liveness: the waiting run started "
        f"{waited.started - expires:.1f}s after the Lease expired and overlapped the "
        f"partitioned work for {work.stopped - waited.started:.1f}s, until the kubelet "
        "came back"
    )
