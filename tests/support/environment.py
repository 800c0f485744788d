"""A real node and the operator around it, for the tools that run outside pytest (the
pod checker, the benchmarks): the e2e fixtures' code paths (tests/e2e/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import kubernetes

from tests.support.controlplane import ControlPlane, make_service_account_kubeconfig
from tests.support.node import RealNode, WorkTracker
from tests.support.operator import (
    NODE_OPERATOR_ARGS,
    OperatorProcess,
    install_chart_rbac,
    render_chart,
)


@dataclass
class PodEnvironment:
    """What the checker needs around it: an admin client, the node, the tracker, the operator."""

    api: kubernetes.client.ApiClient
    nodes: list[RealNode]
    tracker: WorkTracker
    operator: OperatorProcess


@contextmanager
def node_and_operator(
    cluster: ControlPlane, env_dir: Path, nodes: int = 1
) -> Iterator[PodEnvironment]:
    """The chart's RBAC, the real node, the work tracker, and the operator as its ServiceAccount.

    The e2e fixtures' code paths (tests/e2e/conftest.py): `RealNode` for
    tests/controlplane/node, `WorkTracker`, and the operator with the image built from our
    Dockerfile.
    """
    env_dir = cluster.env_dir or env_dir
    api = kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))
    plane = ControlPlane(cluster.kubeconfig, cluster.env, env_dir)
    try:
        account = install_chart_rbac(api, cluster.env)
    except kubernetes.utils.FailToCreateError as error:
        if any(e.status != 409 for e in error.api_exceptions):
            raise
        account = next(
            d["metadata"]["name"]
            for d in render_chart(cluster.env)
            if d["kind"] == "ServiceAccount"
        )
    operator_kubeconfig = make_service_account_kubeconfig(
        plane, api, "cronlock-system", account, env_dir
    )
    fleet = [
        RealNode(dict(cluster.env, CRONLOCK_TESTENV_DIR=str(env_dir)), index=index)
        for index in range(1, nodes + 1)
    ]
    for node in fleet:
        node.start()
    tracker = WorkTracker()
    operator = OperatorProcess(
        operator_kubeconfig, env_dir / "pods-operator.log", cluster.env, list(NODE_OPERATOR_ARGS)
    )
    try:
        tracker.start()
        operator.start()
        yield PodEnvironment(api, fleet, tracker, operator)
    finally:
        operator.stop()
        tracker.close()
        for node in reversed(fleet):
            node.stop()
        api.close()
