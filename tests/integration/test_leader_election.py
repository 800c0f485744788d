"""Two operator replicas with leader election: only the leader writes, and the other takes
over when the leader is killed (SIGKILL: no release, its Lease just stops being renewed)."""

from __future__ import annotations

import json
import re
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cronlock_operator.runtime import leader
from tests.support import gen
from tests.support.controlplane import ControlPlane
from tests.support.kube import holds, wait_for
from tests.support.objects import injected
from tests.support.operator import OPERATOR_NAMESPACE, OperatorProcess, get
from tests.support.ports import free_port

# Named as the operator policy admits an operator's Leases (cronlock-*).
LEASE = "cronlock-test-leader"
ELECTION = ["--leader-election", "--leader-election-lease", f"{OPERATOR_NAMESPACE}/{LEASE}"]
# What only a writing operator logs.
WRITES = re.compile(r"Injected|lease \S+ created|holder RBAC in")


def create(api: kubernetes.client.ApiClient, namespace: str, name: str) -> None:
    kubernetes.client.BatchV1Api(api).create_namespaced_cron_job(
        namespace, gen.cronjob(name, gen.in_namespace(None), gen.never_due())
    )


def leader_gauge(port: int) -> float:
    """The replica's `cronlock_leader`, scraped from its /metrics."""
    _, text = get(f"http://127.0.0.1:{port}/metrics")
    families = {family.name: family for family in text_string_to_metric_families(text)}
    return families["cronlock_leader"].samples[0].value


@pytest.fixture
def replicas(
    controlplane: ControlPlane, operator_kubeconfig: Path, tmp_path: Path
) -> Iterator[list[OperatorProcess]]:
    started = [
        OperatorProcess(
            operator_kubeconfig,
            tmp_path / f"operator-{n}.log",
            controlplane.env,
            [
                *ELECTION,
                *("--metrics-port", str(free_port()), "--metrics-bind-address", "127.0.0.1"),
                *("--liveness", f"http://127.0.0.1:{free_port()}/healthz"),
            ],
        )
        for n in (1, 2)
    ]
    yield started
    for replica in started:
        replica.stop()
    kubernetes.client.CoordinationV1Api(controlplane.api_client()).delete_namespaced_lease(
        LEASE, OPERATOR_NAMESPACE
    )


def liveness(replica: OperatorProcess) -> tuple[int, str]:
    """(status, state) of the replica's /healthz."""
    url = replica.args[replica.args.index("--liveness") + 1]
    try:
        status, body = get(url)
    except urllib.error.HTTPError as error:  # 503: starting or stalled
        status, body = error.code, error.read().decode()
    return status, json.loads(body)["state"]


def test_only_the_leader_writes_and_the_other_replica_takes_over_when_it_is_killed(
    api: kubernetes.client.ApiClient, namespace: str, replicas: list[OperatorProcess]
) -> None:
    first, second = replicas
    first.start(until="leading: lease")
    second.start(until="waiting to lead")
    for name in ("one", "two", "three"):
        create(api, namespace, name)
    for name in ("one", "two", "three"):
        wait_for(lambda name=name: injected(api, namespace, name), 30, f"{name} injected")
    assert WRITES.search(first.log())
    # The follower does not watch CronJobs while it waits to lead: it looks at the leader's
    # Lease every renew period, and a look that took the lead would start its handlers.
    # Over two of its looks after the three were injected it writes nothing.
    holds(
        lambda: not WRITES.search(second.log()),
        2 * leader.TIMING.renew,
        "the follower writes nothing",
    )
    leases = kubernetes.client.CoordinationV1Api(api)
    holder = leases.read_namespaced_lease(LEASE, OPERATOR_NAMESPACE).spec.holder_identity
    assert first.process is not None
    assert holder.endswith(f"_{first.process.pid}")
    # Both serve /metrics (a follower that did not would be a down target); one leads.
    first_port, second_port = (int(r.args[r.args.index("--metrics-port") + 1]) for r in replicas)
    assert (leader_gauge(first_port), leader_gauge(second_port)) == (1, 0)
    # Both are alive to the kubelet: the leader running its loop, the other waiting.
    assert (liveness(first), liveness(second)) == ((200, "running"), (200, "waiting"))

    killed_at = time.monotonic()
    first.kill()
    wait_for(lambda: "leading: lease" in second.log(), 40, "the second replica to lead")
    took = time.monotonic() - killed_at
    # Not before the Lease's duration (15s) plus the skew (2s) since it last changed.
    assert took > 13, took
    create(api, namespace, "four")
    wait_for(lambda: injected(api, namespace, "four"), 30, "four injected by the new leader")
    assert WRITES.search(second.log())
    holder = leases.read_namespaced_lease(LEASE, OPERATOR_NAMESPACE).spec.holder_identity
    assert second.process is not None
    assert holder.endswith(f"_{second.process.pid}")
    assert leader_gauge(second_port) == 1
    wait_for(lambda: liveness(second) == (200, "running"), 10, "the new leader's loop to beat")
