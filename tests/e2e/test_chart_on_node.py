"""The Helm chart's operator as a pod on the real node: `helm install --wait` brings it up
under restricted Pod Security with the chart's RBAC and admission policy, it injects a
CronJob, and `helm test` passes while it serves its metrics and fails, saying why, when
no replica is left."""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes
import pytest

from tests.support.controlplane import ControlPlane
from tests.support.helm import TEST_WAIT, guard, helm, install
from tests.support.kube import wait_for
from tests.support.node import RealNode
from tests.support.objects import injected, read


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


@pytest.mark.timeout(600)
def test_the_charts_operator_injects_and_helm_test_passes_then_fails_saying_why_without_it(
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

    # With no replica left, `helm test` fails, and its Pod's log says why.
    controlplane.kubectl("scale", "deployment", fullname, "-n", namespace, "--replicas=0")
    core = kubernetes.client.CoreV1Api(api)
    wait_for(
        lambda: (
            not core.list_namespaced_pod(
                namespace,
                label_selector=f"app.kubernetes.io/instance={name},"
                "app.kubernetes.io/component!=test",
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
