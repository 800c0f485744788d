"""The Helm chart's operator as a pod on the real node: `helm install --wait` brings it up
under restricted Pod Security with the chart's RBAC and admission policy, it injects a
CronJob, and `helm test` passes while it serves its metrics and fails, saying why, when
no replica is left."""

from __future__ import annotations

import re
from collections.abc import Iterator

import kubernetes
import pytest

from tests.support import gen
from tests.support.controlplane import ControlPlane
from tests.support.helm import TEST_WAIT, guard, helm, install
from tests.support.kube import wait_for
from tests.support.node import RealNode
from tests.support.objects import injected, read
from tests.support.papers import INSTALL_MD, marked_block, run_shell
from tests.support.paths import ROOT


def check_it_works(name: str, fullname: str, namespace: str) -> str:
    """docs/INSTALL.md's checks for this release (`cronlock` in the paper: its fullname is
    the release's) in this namespace, and the CronJob `report` in it for NAME/NAMESPACE."""
    block = marked_block(INSTALL_MD, "check-it-works")
    for old, new in (
        ("helm test cronlock ", f"helm test {name} "),
        ("deployment cronlock", f"deployment {fullname}"),
        ("deployment/cronlock", f"deployment/{fullname}"),
        ("cronlock-system", namespace),
        ("NAMESPACE", namespace),  # before NAME, which it contains
        ("NAME", "report"),
    ):
        assert old in block, f"the block no longer names {old!r}:\n{block}"
        block = block.replace(old, new)
    return block


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
    # docs/INSTALL.md's "Check it works", a line at a time as a user runs it: the first
    # three check the release, the rest guard a CronJob of theirs (here `report`).
    lines = check_it_works(name, fullname, namespace).splitlines()
    assert len(lines) == 6, lines
    batch = kubernetes.client.BatchV1Api(api)
    batch.create_namespaced_cron_job(
        namespace, gen.cronjob("report", gen.in_namespace(None), gen.not_opted_in())
    )
    passed = run_shell("\n".join(lines[:3]), controlplane.env, ROOT, timeout=300)
    assert f"TEST SUITE:     {fullname}-test" in passed
    assert "Phase:          Succeeded" in passed
    assert "/metrics: cronlock's metrics" in passed  # the check's own log line
    assert re.search(rf"(?m)^{fullname} +1/1 ", passed), passed  # get deployment
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
    # chart's RBAC: the CronJob annotated by the paper's line gets the sidecar and its Lease
    # (a user reads them once the operator wrote them; here: waited for).
    run_shell(lines[3], controlplane.env, ROOT, timeout=60)
    wait_for(lambda: injected(api, namespace, "report"), 60, "the chart's operator to inject")
    leases = kubernetes.client.CoordinationV1Api(api)
    wait_for(
        lambda: (
            "cronlock-report"
            in {x.metadata.name for x in leases.list_namespaced_lease(namespace).items}
        ),
        30,
        "the Lease",
    )
    shown = run_shell("\n".join(lines[4:]), controlplane.env, ROOT, timeout=60)
    assert re.search(r"(?m)^cronlock-report ", shown), shown
    assert re.search(r"(?m)\bInjected\b.*cronjob/report\b", shown), shown

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
    )  # as gen.cronjob wrote it
    leases = kubernetes.client.CoordinationV1Api(api).list_namespaced_lease(namespace).items
    assert [lease.metadata.name for lease in leases] == []
