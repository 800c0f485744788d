"""Fixtures of the clusters ring: two real clusters, A and B, running the same CronJobs on
one lock in Redis and one in PostgreSQL.

Each cluster is its own control plane (etcd, kube-apiserver, kube-controller-manager
creating the Jobs, started by tests/controlplane/up in a directory of its own), its own
kube-scheduler and real node (kubelet, containerd, runc: nodes 3 and 4 of
tests/controlplane/node.py, each `--cluster` of its control plane, its pods' `kubernetes`
Service relayed to that control plane alone) and the operator, as the chart's account.
Cluster A is the session's control plane; B's is started here. B's node sets up every
pod's network `LATE` seconds late (`--pod-start-delay`, a chained CNI plugin that waits),
so each of B's runs starts well after A's run of the same tick has ended: the case where
a lock that only keeps runs apart lets the tick be worked twice.

Redis and PostgreSQL run on the host, listening on the host's ends of both nodes' links,
where each cluster's pods reach them; node 1 and node 2 (the e2e ring's) are not touched,
so this ring runs beside the e2e ring.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import psycopg
import pytest
import redis

from tests.support import evidence
from tests.support.controlplane import ControlPlane, make_service_account_kubeconfig, started
from tests.support.ledger import TickLedger
from tests.support.node import HOST_LINK_IPS, LeaseRecorder, PodRecorder, RealNode
from tests.support.operator import (
    NODE_OPERATOR_ARGS,
    OPERATOR_NAMESPACE,
    OperatorProcess,
    install_chart_rbac,
)
from tests.support.processes import ControlPlaneProcesses
from tests.support.stores import PostgresServer, RedisServer, running

HERE = Path(__file__).resolve().parent
# Cluster B's pods start this late: after A's run of the same tick (its pod's start, the
# claim, 2 s of work, the release) has ended on this shared, loaded machine.
LATE = 15.0
NODES = {"a": 3, "b": 4}
LINKS = tuple(HOST_LINK_IPS[index] for index in NODES.values())
NEEDS_OWN_PLANE = (
    "the clusters ring starts two control planes and their real nodes itself; with "
    "CRONLOCK_TEST_KUBECONFIG={} it cannot. Unset CRONLOCK_TEST_KUBECONFIG"
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse at once, before any test runs, rather than fail (or skip) every test here."""
    external = os.environ.get("CRONLOCK_TEST_KUBECONFIG")
    if external and any(item.path.is_relative_to(HERE) for item in items):
        raise pytest.UsageError(NEEDS_OWN_PLANE.format(external))


@dataclass
class Cluster:
    """One cluster: its control plane, admin client, node and operator."""

    name: str
    plane: ControlPlane
    api: kubernetes.client.ApiClient
    node: RealNode
    operator: OperatorProcess

    @property
    def link(self) -> str:
        """The host's end of its node's link: where its pods reach the stores and ledger."""
        return self.node.host_link_ip

    @property
    def core(self) -> kubernetes.client.CoreV1Api:
        return kubernetes.client.CoreV1Api(self.api)

    @property
    def batch(self) -> kubernetes.client.BatchV1Api:
        return kubernetes.client.BatchV1Api(self.api)

    def _processes(self) -> ControlPlaneProcesses:
        assert self.plane.env_dir is not None
        return ControlPlaneProcesses(self.plane.env_dir, self.plane.env)

    def stop_controlplane(self) -> None:
        """Stop (SIGSTOP) every process of its control plane: etcd, the API server, the
        controller manager. Its node and pods run on; nothing answers them."""
        processes = self._processes()
        for component in processes.components():
            processes.pause(component)

    def resume_controlplane(self) -> None:
        processes = self._processes()
        processes.resume_all()
        processes.wait_ready()


def make_cluster(
    name: str, plane: ControlPlane, directory: Path, pod_start_delay: float = 0.0
) -> Iterator[Cluster]:
    if plane.env_dir is None:
        pytest.fail(NEEDS_OWN_PLANE.format(plane.kubeconfig), pytrace=False)
    env = dict(plane.env, CRONLOCK_TESTENV_DIR=str(plane.env_dir))
    node = RealNode(env, NODES[name], cluster=plane.env_dir, pod_start_delay=pod_start_delay)
    node.start()
    try:
        api = plane.api_client()
        account = install_chart_rbac(api, plane.env)
        kubeconfig = make_service_account_kubeconfig(
            plane, api, OPERATOR_NAMESPACE, account, directory
        )
        operator = OperatorProcess(
            kubeconfig, directory / "operator.log", plane.env, list(NODE_OPERATOR_ARGS)
        )
        operator.start()
        try:
            yield Cluster(name, plane, api, node, operator)
        finally:
            operator.stop()
    finally:
        node.stop()


@pytest.fixture(scope="session")
def cluster_a(
    controlplane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """Cluster A: the session's control plane, node 3, its operator."""
    yield from make_cluster("a", controlplane, tmp_path_factory.mktemp("cluster-a"))


@pytest.fixture(scope="session")
def cluster_b(
    controlplane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """Cluster B: a control plane of its own, node 4 (its pods `LATE`), its operator."""
    if controlplane.env_dir is None:
        pytest.fail(NEEDS_OWN_PLANE.format(controlplane.kubeconfig), pytrace=False)
    env_dir = controlplane.env_dir.with_name(controlplane.env_dir.name + "-b")
    with started(env_dir) as plane:
        yield from make_cluster("b", plane, tmp_path_factory.mktemp("cluster-b"), LATE)
    if not os.environ.get("CRONLOCK_KEEP_TESTENV"):
        shutil.rmtree(env_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_on_links(cluster_a: Cluster, cluster_b: Cluster) -> Iterator[RedisServer]:
    """Redis on loopback and on both nodes' links (the addresses exist once they are up)."""
    with running("redis", also_on=(cluster_a.link, cluster_b.link)) as server:
        assert isinstance(server, RedisServer)
        yield server


@pytest.fixture(scope="session")
def postgres_on_links(cluster_a: Cluster, cluster_b: Cluster) -> Iterator[PostgresServer]:
    with running("postgres", also_on=(cluster_a.link, cluster_b.link)) as server:
        assert isinstance(server, PostgresServer)
        yield server


@pytest.fixture
def ledger(cluster_a: Cluster, cluster_b: Cluster) -> Iterator[TickLedger]:
    book = TickLedger([cluster_a.link, cluster_b.link])
    book.start()
    yield book
    book.close()


@dataclass
class Watched:
    """What a test's namespace in one cluster saw: its pods and (unused by stores) Leases."""

    cluster: Cluster
    pods: PodRecorder
    leases: LeaseRecorder


@pytest.fixture
def both(
    cluster_a: Cluster, cluster_b: Cluster, request: pytest.FixtureRequest
) -> Iterator[tuple[str, dict[str, Watched]]]:
    """The same namespace in both clusters (a store lock's key names it), watched; a
    failing test keeps each cluster's evidence (tests/support/evidence.py)."""
    stem = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    namespace = f"{stem}-{secrets.token_hex(3)}"
    watched = {}
    for cluster in (cluster_a, cluster_b):
        cluster.core.create_namespace(
            {"metadata": {"name": namespace, "labels": {"cronlock.test/namespace": "true"}}}
        )
        pods, leases = PodRecorder(cluster.api, namespace), LeaseRecorder(cluster.api, namespace)
        pods.start()
        leases.start()
        watched[cluster.name] = Watched(cluster, pods, leases)
    yield namespace, watched
    failed = evidence.failed(request.node)
    for seen in watched.values():
        seen.leases.stop()
        if failed:
            folder = evidence.keep(
                f"{request.node.nodeid}[cluster-{seen.cluster.name}]",
                seen.cluster.api,
                namespace,
                seen.pods,
                seen.leases,
                [seen.cluster.node],
                operator_log=seen.cluster.operator.log(),
            )
            evidence.kept(request.config, folder)
        seen.pods.stop()
        seen.cluster.core.delete_namespace(namespace, propagation_policy="Background")


@dataclass
class StoreHistory:
    """Every version of the namespace's locks in Redis and PostgreSQL, as polled twice a
    second (the stores have no watch): a failing test's `stores.jsonl`."""

    namespace: str
    redis_url: str
    postgres_url: str
    versions: list[dict[str, Any]] = field(default_factory=list)
    _stopped: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._poll, daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()

    def _poll(self) -> None:
        last: dict[str, str] = {}
        while not self._stopped.wait(0.5):
            for where, document in self._read():
                if last.get(where) != document:
                    last[where] = document
                    self.versions.append({"seen": time.time(), "lock": where, "doc": document})

    def _read(self) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        try:
            with redis.Redis.from_url(
                self.redis_url, socket_timeout=2, decode_responses=True
            ) as client:
                for key in client.scan_iter(match=f"cronlock:{{{self.namespace}/*}}:lease"):
                    found.append((f"redis {key}", str(client.hget(key, "doc"))))
        except redis.RedisError as error:
            found.append(("redis", f"(unreadable: {error})"))
        try:
            with psycopg.connect(self.postgres_url, connect_timeout=2) as connection:
                rows = connection.execute(
                    "SELECT name, document::text FROM cronlock.locks WHERE namespace = %s",
                    (self.namespace,),
                ).fetchall()
                found += [(f"postgres {name}", str(document)) for name, document in rows]
        except psycopg.errors.UndefinedTable:
            pass  # no run has claimed a lock there yet
        except psycopg.Error as error:
            found.append(("postgres", f"(unreadable: {error})"))
        return found

    def write(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "stores.jsonl").write_text(
            "".join(json.dumps(version) + "\n" for version in self.versions)
        )


@pytest.fixture
def store_history(
    both: tuple[str, dict[str, Watched]],
    redis_on_links: RedisServer,
    postgres_on_links: PostgresServer,
    ledger: TickLedger,
    request: pytest.FixtureRequest,
) -> Iterator[StoreHistory]:
    """The locks' versions in both stores while the test runs; with the ledger's lines,
    kept as evidence when it fails."""
    history = StoreHistory(both[0], redis_on_links.url, postgres_on_links.url)
    history.start()
    yield history
    history.stop()
    if evidence.failed(request.node):
        folder = evidence.folder_for(request.node.nodeid)
        history.write(folder)
        (folder / "ledger.txt").write_text(
            "".join(
                f"{entry.heard:.3f} {entry.job} {entry.tick_file} {entry.cluster} {entry.pod}\n"
                for entry in ledger.entries()
            )
        )
        evidence.kept(request.config, folder)
