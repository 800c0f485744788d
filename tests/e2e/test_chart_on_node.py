"""The Helm chart's operator as a pod on the real node: `helm install --wait` brings it up
under restricted Pod Security with the chart's RBAC and admission policy, it injects a
CronJob, and `helm test` passes while it serves its metrics and fails, saying why, when
no replica is left."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator

import kubernetes
import pytest

from tests.support.controlplane import ControlPlane
from tests.support.cronjobs import make_cronjob
from tests.support.kube import run_tool, wait_for
from tests.support.node import CRONLOCK_IMAGE, RealNode
from tests.support.objects import injected, read
from tests.support.operator import SIDECAR_IMAGE
from tests.support.paths import ROOT

CHART = ROOT / "charts" / "cronlock"
RESTRICTED = (
    "pod-security.kubernetes.io/enforce=restricted",
    "pod-security.kubernetes.io/warn=restricted",
)
# Long enough for a loaded machine to start the operator; the failing case waits it out.
TEST_WAIT = "15s"


def helm(
    controlplane: ControlPlane, *args: str, check: bool = True, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return run_tool(controlplane.env, "helm", *args, check=check, timeout=timeout, cwd=ROOT)


def install(controlplane: ControlPlane, namespace: str, *values: str) -> tuple[str, str]:
    """The chart installed into a restricted namespace, watching it, with the images built
    from our Dockerfile (never pulled), and `values` (--set) on top. (release, fullname)"""
    controlplane.kubectl("label", "namespace", namespace, "--overwrite", *RESTRICTED)
    name = f"cl-{secrets.token_hex(3)}"
    repository, tag = CRONLOCK_IMAGE.rsplit(":", 1)
    sidecar_repository, sidecar_tag = SIDECAR_IMAGE.rsplit(":", 1)
    settings = [
        f"image.repository={repository},image.tag={tag},image.pullPolicy=Never",
        f"sidecarImage.repository={sidecar_repository},sidecarImage.tag={sidecar_tag}",
        f"sidecarImage.pullPolicy=Never,watchNamespaces={{{namespace}}},tests.wait={TEST_WAIT}",
        *values,
    ]
    args = [arg for value in settings for arg in ("--set", value)]
    helm(
        controlplane,
        "install",
        name,
        str(CHART),
        "-n",
        namespace,
        *args,
        "--wait",
        "--timeout",
        "180s",
    )
    return name, f"{name}-cronlock"


@pytest.fixture
def release(
    controlplane: ControlPlane, node: RealNode, namespace: str
) -> Iterator[tuple[str, str]]:
    """`install` with the chart's defaults; uninstalled afterwards."""
    name, fullname = install(controlplane, namespace)
    try:
        yield name, fullname
    finally:
        helm(controlplane, "uninstall", name, "-n", namespace, "--wait", check=False)


def guard(api: kubernetes.client.ApiClient, namespace: str, name: str) -> None:
    """A CronJob opted in, injected by the chart's operator with its Lease."""
    batch = kubernetes.client.BatchV1Api(api)
    batch.create_namespaced_cron_job(namespace, make_cronjob(name=name, namespace=None))
    wait_for(lambda: injected(api, namespace, name), 60, "the chart's operator to inject")
    leases = kubernetes.client.CoordinationV1Api(api)
    wait_for(
        lambda: any(
            lease.metadata.name == f"cronlock-{name}"
            for lease in leases.list_namespaced_lease(namespace).items
        ),
        30,
        "the chart's operator to create the Lease",
    )


@pytest.mark.timeout(420)
def test_the_charts_operator_runs_on_the_node_injects_and_passes_helm_test(
    controlplane: ControlPlane,
    api: kubernetes.client.ApiClient,
    namespace: str,
    release: tuple[str, str],
) -> None:
    name, fullname = release
    passed = helm(controlplane, "test", name, "-n", namespace, "--logs", "--timeout", "120s")
    assert f"TEST SUITE:     {fullname}-test" in passed.stdout
    assert "Phase:          Succeeded" in passed.stdout
    assert "/metrics: cronlock's metrics" in passed.stdout  # the check's own log line
    # Its account went with its success; its Pod stays, Succeeded, for its log.
    left = controlplane.kubectl(
        "get", "serviceaccount,role,rolebinding", "-n", namespace, "-o", "name"
    ).split()
    assert not [name for name in left if name.endswith(f"/{fullname}-test")], left
    phase = controlplane.kubectl(
        "get", "pod", f"{fullname}-test", "-n", namespace, "-o", "jsonpath={.status.phase}"
    )
    assert phase == "Succeeded"

    # The operator in its pod injects through the pods' path to the API server, with the
    # chart's RBAC: the CronJob gets the sidecar and its Lease.
    guard(api, namespace, "report")


@pytest.mark.timeout(420)
def test_helm_test_fails_and_says_why_when_no_operator_serves(
    controlplane: ControlPlane,
    api: kubernetes.client.ApiClient,
    namespace: str,
    release: tuple[str, str],
) -> None:
    name, fullname = release
    controlplane.kubectl("scale", "deployment", fullname, "-n", namespace, "--replicas=0")
    core = kubernetes.client.CoreV1Api(api)
    wait_for(
        lambda: (
            not core.list_namespaced_pod(
                namespace, label_selector=f"app.kubernetes.io/instance={name}"
            ).items
        ),
        90,
        "the operator's pod to go",
    )
    failed = helm(controlplane, "test", name, "-n", namespace, "--timeout", "120s", check=False)
    assert failed.returncode != 0
    assert f"{fullname}-test" in failed.stderr
    log = controlplane.kubectl("logs", f"pod/{fullname}-test", "-n", namespace)
    assert f"Service {namespace}/{fullname}-metrics has no ready endpoint" in log
    assert f"served cronlock's metrics within {TEST_WAIT}" in log


@pytest.mark.timeout(420)
def test_helm_uninstall_with_revert_runs_its_hook_on_the_node_and_puts_the_cronjob_back(
    controlplane: ControlPlane,
    api: kubernetes.client.ApiClient,
    namespace: str,
    node: RealNode,
) -> None:
    name, _ = install(controlplane, namespace, "uninstall.revert=true")
    guard(api, namespace, "report")

    # The post-delete hook Job (`cronlock-operator --uninstall`, the operator's image under
    # restricted Pod Security) runs on the node; helm waits for it.
    helm(controlplane, "uninstall", name, "-n", namespace, "--wait", "--timeout", "180s")

    assert not injected(api, namespace, "report")
    cronjob = read(api, namespace, "report")
    assert cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"] == (
        "OnFailure"
    )  # as make_cronjob wrote it
    leases = kubernetes.client.CoordinationV1Api(api).list_namespaced_lease(namespace).items
    assert [lease.metadata.name for lease in leases] == []
