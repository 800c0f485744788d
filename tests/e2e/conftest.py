"""Fixtures of the end-to-end ring: the real node, the operator injecting our image, and a
namespace whose pods run there (`Scenario`, in tests/e2e/scenario.py).

The node is node 1 (with node 2 of its fleet and the registry), or, with
CRONLOCK_E2E_NODE=5, node 5 as the only node of this session's control plane (`node up
--cluster`): `make test` runs the e2e tests as two rings side by side, "e2e" on node 1 and
"e2e-b" on node 5 (tests/rings.py). A test that needs node 2 or the registry is in "e2e"."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest

from tests.e2e.scenario import Scenario
from tests.support import evidence
from tests.support.controlplane import ControlPlane
from tests.support.kube import wait_for
from tests.support.node import (
    LeaseRecorder,
    PodRecorder,
    RealNode,
    WorkTracker,
    e2e_node_index,
)
from tests.support.operator import NODE_OPERATOR_ARGS, OperatorProcess

HERE = Path(__file__).resolve().parent
NEEDS_OWN_PLANE = (
    "the e2e ring runs pods on the real node the tests start, joined to the control plane "
    "the tests start; with CRONLOCK_TEST_KUBECONFIG={} it has neither. Unset "
    "CRONLOCK_TEST_KUBECONFIG, or run only tests/unit and tests/integration against that "
    "cluster"
)
# CRONLOCK_E2E_NODE (tests/support/node.py e2e_node_index) names a node of its own cluster.
NODE1_ONLY = (
    "{what} is node 1's (CRONLOCK_E2E_NODE={index} runs node {index}, the only node of its "
    'own cluster): run this test in the e2e ring on node 1 (tests/rings.py RINGS["e2e"])'
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse at once, before any test runs, rather than fail (or skip) every e2e test."""
    external = os.environ.get("CRONLOCK_TEST_KUBECONFIG")
    if external and any(item.path.is_relative_to(HERE) for item in items):
        raise pytest.UsageError(NEEDS_OWN_PLANE.format(external))
    if any(item.path.is_relative_to(HERE) for item in items):
        try:  # a bad CRONLOCK_E2E_NODE is refused before anything starts
            e2e_node_index()
        except ValueError as error:
            raise pytest.UsageError(str(error)) from None


@pytest.fixture(scope="session")
def node(controlplane: ControlPlane) -> Iterator[RealNode]:
    """The real node, one per session, started after the control plane and stopped before it:
    node 1, or (CRONLOCK_E2E_NODE) a node that is this control plane's only one."""
    if controlplane.env_dir is None:
        pytest.fail(NEEDS_OWN_PLANE.format(controlplane.kubeconfig), pytrace=False)
    env = dict(controlplane.env, CRONLOCK_TESTENV_DIR=str(controlplane.env_dir))
    index = e2e_node_index()
    real = RealNode(env) if index == 1 else RealNode(env, index, cluster=controlplane.env_dir)
    real.start()
    yield real
    real.stop()


@pytest.fixture(scope="session")
def fleet_node(node: RealNode) -> Iterator[RealNode]:
    """Node 2 of the fleet, started once per session when a module first asks for it
    (`second_node`): each start also runs the image script and waits for its kubelet."""
    if node.cluster is not None:
        pytest.fail(NODE1_ONLY.format(what="Node 2", index=node.index), pytrace=False)
    other = RealNode(node.env, index=2)
    other.start()
    yield other
    other.stop()


@pytest.fixture(scope="module")
def second_node(api: kubernetes.client.ApiClient, fleet_node: RealNode) -> Iterator[RealNode]:
    """Node 2 for one module's tests, schedulable during them only: cordoned after them,
    so the single-node tests place nothing there (the module's pods went with their
    namespaces)."""
    schedulable(api, fleet_node.name, True)
    yield fleet_node
    schedulable(api, fleet_node.name, False)


def schedulable(api: kubernetes.client.ApiClient, name: str, on: bool) -> None:
    """Uncordon or cordon the Node; retried while a fault test's deleted Node re-registers."""
    core = kubernetes.client.CoreV1Api(api)

    def patched() -> bool:
        try:
            core.patch_node(name, {"spec": {"unschedulable": not on}})
        except kubernetes.client.ApiException as error:
            if error.status != 404:
                raise
            return False
        return True

    wait_for(patched, timeout=60, what=f"Node {name} to exist, to set unschedulable={not on}")


@pytest.fixture(scope="session")
def tracker(node: RealNode) -> Iterator[WorkTracker]:
    """On the host's end of the node's link: node 1's (node 2's pods reach it too), or a
    cluster node's own, the only host address its pods reach."""
    works = WorkTracker(node.host_link_ip)
    works.start()
    yield works
    works.close()


@pytest.fixture(scope="module")
def node_operator(
    controlplane: ControlPlane,
    operator_kubeconfig: Path,
    node: RealNode,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[OperatorProcess]:
    """The real operator, injecting the sidecar image built from our Dockerfile (never pulled);
    a module's `NODE_OPERATOR_ARGS` are added to its command line (its settings there)."""
    log = tmp_path_factory.mktemp("operator-log") / "operator.log"
    process = OperatorProcess(
        operator_kubeconfig,
        log,
        controlplane.env,
        [
            *NODE_OPERATOR_ARGS,
            *getattr(request.module, "NODE_OPERATOR_ARGS", ()),
        ],
    )
    process.start()
    yield process
    process.stop()


@pytest.fixture
def cluster(
    api: kubernetes.client.ApiClient,
    namespace: str,
    node_operator: OperatorProcess,
    node: RealNode,
    tracker: WorkTracker,
    request: pytest.FixtureRequest,
) -> Iterator[Scenario]:
    """A namespace whose pods run on the real node, with the operator watching it; a test
    that fails leaves its evidence (tests/support/evidence.py)."""
    recorder = PodRecorder(api, namespace)
    recorder.start()
    leases = LeaseRecorder(api, namespace)
    leases.start()
    yield Scenario(api, namespace, node, node_operator, tracker, recorder, leases)
    leases.stop()
    if evidence.failed(request.node):
        folder = evidence.keep(
            request.node.nodeid,
            api,
            namespace,
            recorder,
            leases,
            [node],
            operator_log=node_operator.log(),
        )
        evidence.kept(request.config, folder)
    recorder.stop()
