"""One lock across clusters, on the real node: a CronJob guarded by a lock in Redis and the
same lock taken elsewhere (the standalone `cronlock-sidecar run --store`, as on a VM or in
another cluster) never work at the same time.

Redis (from Debian) listens on the host's end of the node's link, where the pods reach
it; the CronJob names a Secret holding its URL (`cronlock.io/store-secret`), and the
operator injects the sidecar image with the store clients (the Dockerfile's
`sidecar-stores` target). The run outside the cluster uses the same Redis on loopback and
the lock's key: `<namespace>/cronlock-<lock>`.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.e2e.scenario import MAIN, UNTIL_FINISHED, Scenario
from tests.support.contract import EXIT_SKIPPED
from tests.support.kube import wait_for
from tests.support.node import HOST_LINK_IP, RealNode
from tests.support.paths import SIDECAR
from tests.support.stores import RedisServer, running

# The CronJob's annotations: its lock in Redis, whose URL is in the Secret team-locks.
IN_REDIS = {"store": "redis", "store-secret": "team-locks"}


@pytest.fixture(scope="module")
def redis_on_link(node: RealNode) -> Iterator[RedisServer]:
    """Redis on loopback and on the node's link (the address exists once the node is up)."""
    with running("redis", also_on=HOST_LINK_IP) as server:
        assert isinstance(server, RedisServer)
        yield server


def secret(cluster: Scenario, server: RedisServer) -> None:
    cluster.core.create_namespaced_secret(
        cluster.namespace,
        {
            "metadata": {"name": "team-locks"},
            "stringData": {"url": server.url_at(HOST_LINK_IP)},
        },
    )


def elsewhere(server: RedisServer, lock: str, script: str) -> subprocess.Popen[str]:
    """The same lock taken outside this cluster: `cronlock-sidecar run --store`."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["CRONLOCK_STORE"] = server.url
    return subprocess.Popen(
        [str(SIDECAR), "run", "--lease", lock, "--ttl", "19s", "--", "sh", "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_pods_lock_in_redis_makes_the_run_elsewhere_skip_and_then_take_it(
    cluster: Scenario, redis_on_link: RedisServer, tmp_path: Path
) -> None:
    secret(cluster, redis_on_link)
    # The pod's work holds until the run elsewhere has decided, however long it takes.
    cluster.cronjob("ledger", f"echo working; {UNTIL_FINISHED}", **IN_REDIS)
    cluster.run("ledger", "ledger-1")
    work = cluster.main_running("ledger-1")
    assert cluster.gate_exit("ledger-1") == 0

    ran = tmp_path / "ran"
    other = elsewhere(redis_on_link, f"{cluster.namespace}/cronlock-ledger", f"touch {ran}")
    _, err = other.communicate(timeout=60)
    assert other.returncode == EXIT_SKIPPED, err
    assert not ran.exists()
    skip_lines = [line for line in err.splitlines() if "already running" in line]
    assert len(skip_lines) == 1, err
    assert "ledger-1-" in skip_lines[0], skip_lines  # the pod's holder identity
    assert work.running, "the run elsewhere decided while the pod's work held the lock"

    cluster.finish(work)  # only now that the run elsewhere has decided
    assert cluster.main_finished("ledger-1") == 0
    assert work.stopped is not None
    # The pod's sidecar gave the lock back at its end: the run elsewhere takes it now.
    again = elsewhere(redis_on_link, f"{cluster.namespace}/cronlock-ledger", f"touch {ran}")
    _, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    assert ran.exists()
    assert "redis" in cluster.sidecar_log("ledger-1")


def test_a_lock_held_elsewhere_makes_the_pod_skip_without_working(
    cluster: Scenario, redis_on_link: RedisServer, tmp_path: Path
) -> None:
    secret(cluster, redis_on_link)
    cluster.cronjob("ledger", "echo WORKED", **IN_REDIS)
    started, release = tmp_path / "started", tmp_path / "release"
    # The run elsewhere holds until the test releases it, once the pod has decided.
    holder = elsewhere(
        redis_on_link,
        f"{cluster.namespace}/cronlock-ledger",
        f"touch {started}; while [ ! -e {release} ]; do sleep 0.2; done; echo released",
    )
    try:
        wait_for(started.exists, 30, "the run elsewhere to hold the lock")
        cluster.run("ledger", "ledger-1")
        assert cluster.gate_exit("ledger-1") == EXIT_SKIPPED
        assert cluster.namespace_works() == []
        # The skip rule failed the Job; the operator counted it (and deleted the Job).
        cluster.wait_event("ledger", "Skipped", timeout=60)
        log = cluster.sidecar_log("ledger-1")
        skip_lines = [line for line in log.splitlines() if "already running" in line]
        assert len(skip_lines) == 1, log
        assert f"lease {cluster.namespace}/cronlock-ledger held by" in skip_lines[0], skip_lines
        assert holder.poll() is None  # the holder was never disturbed
    finally:
        release.touch()
        out, err = holder.communicate(timeout=60)
    assert holder.returncode == 0, err
    assert "released" in out


def tick_text(minutes: int) -> str:
    return datetime.datetime.fromtimestamp(minutes * 60, datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def test_a_pods_work_on_a_store_lock_says_its_tick_succeeded_and_the_next_tick_reads_it(
    cluster: Scenario, redis_on_link: RedisServer
) -> None:
    """Issue 56 item 3 on a store lock: the sidecar does not learn its work's exit code, so
    the work creates CRONLOCK_SUCCESS_FILE; the sidecar's release records the tick's
    success in Redis, a tick whose work does not create it leaves the record, and the next
    tick's work reads the last success in tick.env."""
    secret(cluster, redis_on_link)
    said = ". /var/run/cronlock/tick.env; cat /var/run/cronlock/tick.env; "
    said += 'touch "$CRONLOCK_SUCCESS_FILE"'
    cluster.cronjob("ledger", said, **IN_REDIS)
    now = int(time.time()) // 60
    # Three ticks the CronJob controller would name so, the newest this minute's.
    worked, failed, latest = (f"ledger-{now - 2}", f"ledger-{now - 1}", f"ledger-{now}")

    def ended(job: str) -> None:
        """The pod ended (the sidecar too, after its release): the next tick may claim."""
        wait_for(
            lambda: (pods := cluster.pods(job)) and pods[-1]["status"].get("phase") == "Succeeded",
            60,
            f"{job}'s pod to end, its sidecar's release done",
        )

    def tick_env(job: str) -> str:
        [pod] = cluster.pods(job)
        log: str = cluster.core.read_namespaced_pod_log(
            pod["metadata"]["name"], cluster.namespace, container=MAIN
        )
        return log

    cluster.run("ledger", worked)
    assert cluster.main_finished(worked) == 0
    ended(worked)
    assert "CRONLOCK_SUCCESS_FILE=/var/run/cronlock-success/succeeded\n" in tick_env(worked)
    assert "records its tick's success" in cluster.sidecar_log(worked)

    # The work of this tick ends well but says nothing: no success recorded.
    cluster.run("ledger", failed, "cat /var/run/cronlock/tick.env")
    assert cluster.main_finished(failed) == 0
    ended(failed)
    assert f"CRONLOCK_LAST_SUCCESS_TICK={tick_text(now - 2)}\n" in tick_env(failed)
    assert "did not create /var/run/cronlock-success/succeeded" in cluster.sidecar_log(failed)

    cluster.run("ledger", latest)
    assert cluster.main_finished(latest) == 0
    ended(latest)
    told = tick_env(latest)
    assert f"CRONLOCK_TICK={tick_text(now)}\n" in told
    assert f"CRONLOCK_PREVIOUS_TICK={tick_text(now - 1)}\n" in told
    assert f"CRONLOCK_LAST_SUCCESS_TICK={tick_text(now - 2)}\n" in told, told
    # And the store has the latest tick's success now, as the latest run's own claim.
    with redis.Redis.from_url(redis_on_link.url, decode_responses=True) as client:
        fields = client.hgetall(f"cronlock:{{{cluster.namespace}/cronlock-ledger}}:lease")
    [document] = [json.loads(v) for v in fields.values() if "cronlock.io/succeeded." in v]
    success = document["metadata"]["annotations"]["cronlock.io/succeeded.ledger"]
    assert success.split(" ")[:2] == [tick_text(now), latest], success
