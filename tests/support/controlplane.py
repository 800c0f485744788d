"""The one handle on a control plane that tests, checkers and benchmarks share.

`started()` runs `tests/controlplane/up` in a directory of its own (or finds it running)
and stops it afterwards; `ControlPlane` is what callers get: the kubeconfig, the
environment for kubectl and helm, clients, and the pids of its components.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from tests.support.kube import run_tool
from tests.support.paths import ROOT
from tests.support.processes import ControlPlaneProcesses

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

    def lease_json(self, namespace: str, name: str) -> dict[str, Any]:
        """The Lease as `kubectl get -o json` shows it (a user's view)."""
        document: dict[str, Any] = json.loads(
            self.kubectl("get", "lease", name, "-n", namespace, "-o", "json")
        )
        return document

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


@contextmanager
def started(env_dir: Path, *, keep: bool = False, ha: bool = False) -> Iterator[ControlPlane]:
    """The local control plane in `env_dir`, started if it is not running (`ha`: 3 etcd
    members and 2 API servers behind a balancer); stopped after unless `keep`. Raises
    RuntimeError naming what `up` printed when it cannot start."""
    env = controlplane_env(env_dir, ha=ha)
    plane = ControlPlane(Path(env["KUBECONFIG"]), env, env_dir)
    try:
        yield plane
    finally:
        plane.close()
        if not keep:
            stop_controlplane(env)


@contextmanager
def own_controlplane(env_dir: Path, keep: bool = False, ha: bool = False) -> Iterator[ControlPlane]:
    """Start tests/controlplane in env_dir (or reuse it if it runs), stop it unless `keep`;
    `ha`: as production runs it (tests/controlplane/controlplane.py)."""
    try:
        context = started(env_dir, keep=keep, ha=ha)
        plane = context.__enter__()
    except RuntimeError as error:
        raise SystemExit(str(error)) from error
    try:
        yield plane
    finally:
        ControlPlaneProcesses(env_dir, plane.env).resume_all()  # a paused one cannot stop
        context.__exit__(None, None, None)


def controlplane_env(env_dir: Path, *, ha: bool = False) -> dict[str, str]:
    """Start (or find) the local control plane in `env_dir`; the environment to reach it.

    Runs `tests/controlplane/up` and applies the `export` lines it prints.
    """
    env = dict(os.environ, CRONLOCK_TESTENV_DIR=str(env_dir))
    env["CRONLOCK_CONTROLPLANE_HA"] = "1" if ha else ""
    result = subprocess.run(
        [str(CONTROLPLANE / "up")], env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        # Not a skip: whoever needs the control plane must fail loudly without it.
        raise RuntimeError(f"tests/controlplane/up failed:\n{result.stderr}{result.stdout}")
    for line in result.stdout.splitlines():
        match = re.fullmatch(r"export (\w+)=(.*)", line)
        if match:
            env[match.group(1)] = os.path.expandvars(match.group(2).strip("'"))
    return env


def stop_controlplane(env: dict[str, str]) -> None:
    subprocess.run([str(CONTROLPLANE / "down")], env=env, capture_output=True, check=False)


ServiceAccountKubeconfig = Callable[[str, str], Path]


def make_service_account_kubeconfig(
    controlplane: ControlPlane,
    api: kubernetes.client.ApiClient,
    namespace: str,
    name: str,
    directory: Path,
    bound_pod: tuple[str, str] | None = None,
) -> Path:
    """A kubeconfig that authenticates as a ServiceAccount with a TokenRequest token;
    `bound_pod` (name, uid) binds the token to that pod, as the kubelet's tokens are."""
    core = kubernetes.client.CoreV1Api(api)
    try:
        core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    except kubernetes.client.ApiException as error:
        if error.status != 409:
            raise
    spec: dict[str, Any] = {"expirationSeconds": 6 * 3600}
    if bound_pod is not None:
        pod, uid = bound_pod
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid}
    token = core.create_namespaced_service_account_token(
        name, namespace, {"spec": spec}
    ).status.token
    suffix = f"-{bound_pod[0]}" if bound_pod is not None else ""
    path = directory / f"{namespace}-{name}{suffix}.kubeconfig"
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
