"""Fixtures shared by every ring: the local control plane, namespaces, ServiceAccount clients."""

from __future__ import annotations

import base64
import os
import re
import secrets
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import kubernetes
import pytest
import yaml

from tests.kube import controlplane_env, run_tool, stop_controlplane
from tests.operator_process import OPERATOR_NAMESPACE, OperatorProcess, install_chart_rbac

ROOT = Path(__file__).resolve().parent.parent
CONTROLPLANE = ROOT / "tests" / "controlplane"


@dataclass
class ControlPlane:
    """A running API server the tests may use; `env_dir` is None for a user's own cluster."""

    kubeconfig: Path
    env: dict[str, str]
    env_dir: Path | None
    _clients: list[kubernetes.client.ApiClient] = field(default_factory=list)

    def kubectl(self, *args: str, check: bool = True, input_text: str | None = None) -> str:
        result = run_tool(self.env, "kubectl", *args, input_text=input_text, check=check)
        return result.stdout if check else result.stdout + result.stderr

    def api_client(self, kubeconfig: Path | None = None) -> kubernetes.client.ApiClient:
        client = kubernetes.config.new_client_from_config(
            config_file=str(kubeconfig or self.kubeconfig)
        )
        self._clients.append(client)
        return client

    def server(self) -> str:
        config = yaml.safe_load(self.kubeconfig.read_text())
        return str(config["clusters"][0]["cluster"]["server"])

    def ca_file(self) -> str:
        config = yaml.safe_load(self.kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        if "certificate-authority" in cluster:
            return str(cluster["certificate-authority"])
        with tempfile.NamedTemporaryFile("wb", suffix=".crt", delete=False) as handle:
            handle.write(base64.b64decode(cluster["certificate-authority-data"]))
        return handle.name

    def pid(self, component: str) -> int:
        if self.env_dir is None:
            pytest.skip(f"needs the local control plane to signal {component}")
        return int((self.env_dir / f"{component}.pid").read_text())

    def pause(self, component: str = "kube-apiserver") -> None:
        os.kill(self.pid(component), signal.SIGSTOP)

    def resume(self, component: str = "kube-apiserver") -> None:
        os.kill(self.pid(component), signal.SIGCONT)

    def close(self) -> None:
        for client in self._clients:
            client.close()


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
    env = controlplane_env(env_dir)
    plane = ControlPlane(Path(env["KUBECONFIG"]), env, env_dir)
    try:
        yield plane
    finally:
        plane.close()
        stop_controlplane(env)
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


ServiceAccountKubeconfig = Callable[[str, str], Path]


def make_service_account_kubeconfig(
    controlplane: ControlPlane,
    api: kubernetes.client.ApiClient,
    namespace: str,
    name: str,
    directory: Path,
) -> Path:
    """A kubeconfig that authenticates as a ServiceAccount with a TokenRequest token."""
    core = kubernetes.client.CoreV1Api(api)
    try:
        core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    except kubernetes.client.ApiException as error:
        if error.status != 409:
            raise
    token = core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": 6 * 3600}}
    ).status.token
    path = directory / f"{namespace}-{name}.kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "test",
                        "cluster": {
                            "server": controlplane.server(),
                            "certificate-authority": controlplane.ca_file(),
                        },
                    }
                ],
                "users": [{"name": name, "user": {"token": token}}],
                "contexts": [
                    {
                        "name": "test",
                        "context": {"cluster": "test", "user": name, "namespace": namespace},
                    }
                ],
                "current-context": "test",
            }
        )
    )
    path.chmod(0o600)
    return path


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
