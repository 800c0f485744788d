"""Run the real `cronlock-operator` as a process, under the RBAC the Helm chart grants."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import yaml

from tests.support import gen
from tests.support.controlplane import ControlPlane, make_service_account_kubeconfig
from tests.support.kube import wait_for
from tests.support.objects import injected
from tests.support.paths import ROOT
from tests.support.versions import pinned

CHART = ROOT / "charts" / "cronlock"
OPERATOR_NAMESPACE = "cronlock-system"
# The sidecar image every test operator injects, and so the one the chart's operator policy
# admits (it pins the injected containers to the configured image): the Dockerfile's
# `sidecar` target, built and imported into the real node's containerd.
SIDECAR_IMAGE = "localhost/cronlock-sidecar:dev"
# ... and the one with the store clients, for locks in Redis or PostgreSQL (the
# Dockerfile's `sidecar-stores` target).
SIDECAR_STORES_IMAGE = "localhost/cronlock-sidecar-stores:dev"
# How an operator on the real node runs (the e2e fixture, the pod checker, the benchmarks):
# the sidecar image built from our Dockerfile, never pulled.
NODE_OPERATOR_ARGS = ("--sidecar-image", SIDECAR_IMAGE, "--sidecar-image-pull-policy", "Never")
SIDECAR_VALUES = (
    f"sidecarImage.repository={SIDECAR_IMAGE.rsplit(':', 1)[0]}",
    f"sidecarImage.tag={SIDECAR_IMAGE.rsplit(':', 1)[1]}",
    f"sidecarStoresImage.repository={SIDECAR_STORES_IMAGE.rsplit(':', 1)[0]}",
    f"sidecarStoresImage.tag={SIDECAR_STORES_IMAGE.rsplit(':', 1)[1]}",
)


def get(url: str) -> tuple[int, str]:
    """One GET of a loopback URL: status and body."""
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback only
        return response.status, response.read().decode()


RBAC_KINDS = {
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


# The chart's policies that judge users' writes, not the operator's: this session's test
# operator has no Deployment, and tests install releases of their own beside it
# (tests/integration/chart/) and try bad annotations on purpose. Their own tests install them
# (test_annotation_policy.py, test_one_operator.py).
NOT_CONFINING = ("-annotations", "-one-operator")


def kube_version() -> str:
    """The control plane's Kubernetes version (tests/controlplane/versions.env), which
    `helm template` needs: the chart requires 1.30+, and a helm built from source, as ours
    is, assumes 1.20 when not told. The compatibility ring's release when it runs one
    (CRONLOCK_KUBERNETES_VERSION, as tests/controlplane/build builds it)."""
    if chosen := os.environ.get("CRONLOCK_KUBERNETES_VERSION"):
        return chosen
    return pinned("KUBERNETES_VERSION")


def render_chart(env: dict[str, str], *values: str) -> list[dict[str, Any]]:
    """`helm template` of the chart: the objects a user's `helm install` would create."""
    args = ["helm", "template", "cronlock", str(CHART), "--namespace", OPERATOR_NAMESPACE]
    # Not `helm test`'s objects: its ServiceAccount, Role and Pod are no part of an install.
    args += ["--kube-version", kube_version(), "--skip-tests"]
    for value in values:
        args += ["--set", value]
    result = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def install_chart_rbac(api: kubernetes.client.ApiClient, env: dict[str, str]) -> str:
    """Create exactly the chart's ServiceAccount and RBAC; return the ServiceAccount name."""
    core = kubernetes.client.CoreV1Api(api)
    try:
        core.create_namespace({"metadata": {"name": OPERATOR_NAMESPACE}})
    except kubernetes.client.ApiException as error:
        if error.status != 409:
            raise
    account = ""
    for doc in render_chart(env, *SIDECAR_VALUES):
        if doc["kind"] not in RBAC_KINDS or doc["metadata"]["name"].endswith(NOT_CONFINING):
            continue
        if doc["kind"] == "ServiceAccount":
            account = doc["metadata"]["name"]
        kubernetes.utils.create_from_dict(api, doc, namespace=OPERATOR_NAMESPACE)
    assert account, "the chart renders no ServiceAccount"
    _wait_for_admission_policy(api, account)
    return account


def _wait_for_admission_policy(api: kubernetes.client.ApiClient, account: str) -> None:
    """The API server enforces a new ValidatingAdmissionPolicy a moment after it exists:
    wait until a dry-run write the policy forbids is refused for the chart's account."""
    impersonating = kubernetes.client.ApiClient(api.configuration)
    impersonating.default_headers["Impersonate-User"] = (
        f"system:serviceaccount:{OPERATOR_NAMESPACE}:{account}"
    )
    leases = kubernetes.client.CoordinationV1Api(impersonating)
    body = {"metadata": {"name": "cronlock-policy-probe"}}

    def enforced() -> bool:
        try:
            leases.create_namespaced_lease("kube-system", body, dry_run="All")
        except kubernetes.client.ApiException as error:
            return error.status == 403 and "ValidatingAdmissionPolicy" in str(error.body)
        return False

    try:
        wait_for(enforced, timeout=30, what="the chart's admission policy to be enforced")
    finally:
        impersonating.close()


@dataclass
class OperatorProcess:
    """The operator as users run it, its log kept in a file for failing tests to show."""

    kubeconfig: Path
    log_path: Path
    env: dict[str, str]
    args: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None

    def start(self, until: str = "cronlock operator started") -> None:
        """Start it and wait for the line `until` in its log (a follower waiting to lead
        never says it started)."""
        env = dict(self.env, KUBECONFIG=str(self.kubeconfig))
        executable = Path(sys.executable).parent / "cronlock-operator"
        # The log is appended across restarts: only this process's lines count.
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    str(executable),
                    *("--metrics-port", "0", "--liveness", ""),
                    *("--sidecar-image", SIDECAR_IMAGE),
                    *("--sidecar-stores-image", SIDECAR_STORES_IMAGE),
                    *self.args,
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_for(
                lambda: until in self.log(offset) or self._exited(),
                # 60 s: on this 2-CPU VM beside six other rings an operator has written
                # nothing for 30 s (test_admission_policy's rogue, twice on 2026-12-06).
                timeout=60,
                what=f"the operator to log {until!r}",
            )
        except BaseException:
            # Started but never ready: stopped here, or it would go on reconciling beside
            # the next test's operator (two of each Event; on 2026-12-06 one slow start
            # failed six later tests so).
            self.stop()
            raise
        assert not self._exited(), f"the operator exited:\n{self.log()[-3000:]}"

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def kill(self) -> None:
        """SIGKILL: no shutdown handlers, whatever the operator was in the middle of."""
        if self.process is None:
            return
        self.process.kill()
        self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self, offset: int = 0) -> str:
        """The log from byte `offset` on (the whole log by default)."""
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    def _exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None


def operator_caught_up(
    api: kubernetes.client.ApiClient,
    handled: Callable[[kubernetes.client.ApiClient, str, str], bool] | None = None,
) -> None:
    """Wait until the operator has taken up every CronJob change made before this call.

    A CronJob opted in now, in a namespace of its own, reaches the operator on its one
    cluster-wide watch after every earlier change, and its FIFO work queue hands out its
    key after theirs: once it is handled (injected, unless `handled` says otherwise), the
    earlier keys have left the queue. Their work may still be running in another worker,
    so follow this with a window (`holds`).
    """
    name = f"caught-up-{secrets.token_hex(3)}"
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespace(
        {"metadata": {"name": name, "labels": {"cronlock.test/namespace": "true"}}}
    )
    try:
        body = gen.cronjob("marker", *gen.BY_HAND)
        kubernetes.client.BatchV1Api(api).create_namespaced_cron_job(name, body)
        wait_for(
            lambda: (handled or injected)(api, name, "marker"),
            timeout=30,
            what="the operator to inject a marker CronJob created after the change under test",
        )
    finally:
        core.delete_namespace(name, propagation_policy="Background")


def env_without_kubeconfig() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}


def start_release_operator(
    api: kubernetes.client.ApiClient,
    controlplane: ControlPlane,
    namespace: str,
    deployment: str,
    directory: Path,
) -> OperatorProcess:
    """A helm release's operator as its pod would run it, where no node runs the pod: its
    Deployment's environment (the images read from its init containers), its
    ServiceAccount's token; started (its log in `directory`)."""
    spec = (
        kubernetes.client.AppsV1Api(api)
        .read_namespaced_deployment(deployment, namespace)
        .spec.template.spec
    )
    [container] = [c for c in spec.containers if c.name == "operator"]
    env = {item.name: item.value for item in container.env or [] if item.value is not None}
    kubeconfig = make_service_account_kubeconfig(
        controlplane, api, namespace, spec.service_account_name, directory
    )
    operator = OperatorProcess(kubeconfig, directory / "operator.log", {**controlplane.env, **env})
    operator.start()
    return operator
