"""Two real nodes: a run on a node cut off from the API server, its kubelet alive, while a
run of the same lock waits on the other node (issue 25's partition, on real parts)."""

from __future__ import annotations

import datetime
import time

import pytest

from tests.e2e.scenario import Scenario
from tests.support.kube import wait_for
from tests.support.node import RealNode, overlapping


def lease_expiry(cluster: Scenario, lock: str) -> tuple[str, float]:
    """The Lease's renew time as written, and when it expires on this host's monotonic
    clock (every node here shares the host's clock)."""
    spec = cluster.lease(lock)["spec"]
    renewed = spec["renewTime"]
    if isinstance(renewed, str):
        renewed = datetime.datetime.fromisoformat(renewed.replace("Z", "+00:00"))
    expires = renewed.timestamp() + float(spec["leaseDurationSeconds"])
    return str(spec["renewTime"]), time.monotonic() + (expires - time.time())


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
    cluster.wait_renewal("ledger")

    with second_node.partitioned():
        partitioned_at = time.monotonic()
        cluster.run("near", "near-1")
        time.sleep(1.5)  # a renewal already on its way lands, or is lost
        renewed, expires = lease_expiry(cluster, "ledger")
        near = cluster.main_running("near-1", timeout=120)
        # Nothing on node 2 wrote the Lease since: the renewal stopped at the partition.
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
    cluster.wait_renewal(lock)
    second_node.stop_kubelet()
    try:
        with second_node.partitioned():
            cut_at = time.monotonic()
            cluster.run(near, f"{near}-1")
            time.sleep(1.5)
            _, expires = lease_expiry(cluster, lock)
            waited = cluster.main_running(f"{near}-1", timeout=120)
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
            # stop: liveness: nothing on node 2 stops the work.
            time.sleep(3)
            assert work.running, "only a kubelet applies the probe; none runs on node 2"
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
