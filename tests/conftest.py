"""Fixtures shared by every ring: the local control plane, namespaces, ServiceAccount clients."""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest

from tests.support.controlplane import (
    ROOT,
    ControlPlane,
    ServiceAccountKubeconfig,
    make_service_account_kubeconfig,
    started,
)
from tests.support.operator import OPERATOR_NAMESPACE, OperatorProcess, install_chart_rbac


@pytest.fixture(scope="session")
def controlplane() -> Iterator[ControlPlane]:
    """One control plane per test session: the user's own, or ours started and stopped here."""
    external = os.environ.get("CRONLOCK_TEST_KUBECONFIG")
    env = dict(os.environ)
    if external:
        env["KUBECONFIG"] = external
        plane = ControlPlane(Path(external), env, None)
        yield plane
        plane.close()
        return
    env_dir = ROOT / ".testenv" / f"pytest-{os.getpid()}"
    with started(env_dir) as plane:
        yield plane
    if not os.environ.get("CRONLOCK_KEEP_TESTENV"):
        shutil.rmtree(env_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def api(controlplane: ControlPlane) -> kubernetes.client.ApiClient:
    """An admin client (system:masters)."""
    return controlplane.api_client()


@pytest.fixture
def namespace(api: kubernetes.client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards."""
    stem = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = f"{stem}-{secrets.token_hex(3)}"
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespace(
        {"metadata": {"name": name, "labels": {"cronlock.test/namespace": "true"}}}
    )
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def service_account_kubeconfig(
    controlplane: ControlPlane, api: kubernetes.client.ApiClient, tmp_path: Path
) -> ServiceAccountKubeconfig:
    """Make a kubeconfig that authenticates as a ServiceAccount (RBAC applies for real)."""

    def make(namespace: str, name: str) -> Path:
        return make_service_account_kubeconfig(controlplane, api, namespace, name, tmp_path)

    return make


@pytest.fixture(scope="session")
def operator_kubeconfig(
    controlplane: ControlPlane,
    api: kubernetes.client.ApiClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """Credentials of the chart's ServiceAccount, with exactly the chart's RBAC installed."""
    account = install_chart_rbac(api, controlplane.env)
    return make_service_account_kubeconfig(
        controlplane, api, OPERATOR_NAMESPACE, account, tmp_path_factory.mktemp("operator")
    )


@pytest.fixture(scope="module")
def operator(
    controlplane: ControlPlane,
    operator_kubeconfig: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    """The real operator, watching every namespace as the chart's ServiceAccount.

    One per test module, so modules that do not ask for it see no operator at all.
    """
    log = tmp_path_factory.mktemp("operator-log") / "operator.log"
    process = OperatorProcess(operator_kubeconfig, log, controlplane.env)
    process.start()
    yield process
    process.stop()
