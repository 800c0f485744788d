"""`helm uninstall` with `uninstall.revert`: the chart's post-delete hook runs
`cronlock-operator --uninstall` with the hook's own account. Here it runs as that account
(its rendered RBAC, scoped to the test's namespace) after the operator stopped, as the
hook does once the release is gone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from tests.kube import wait_for
from tests.operator_process import OPERATOR_NAMESPACE, OperatorProcess, render_chart
from tests.support.controlplane import ControlPlane, make_service_account_kubeconfig
from tests.support.cronjobs import make_cronjob
from tests.support.objects import comparable, injected, read

OURS = {"app.kubernetes.io/managed-by": "cronlock"}


def hook_account(
    api: kubernetes.client.ApiClient, controlplane: ControlPlane, namespace: str, tmp_path: Path
) -> Path:
    """The hook's ServiceAccount and RBAC exactly as the chart renders them."""
    docs = render_chart(
        controlplane.env, "uninstall.revert=true", f"watchNamespaces={{{namespace}}}"
    )
    hooks = [
        doc
        for doc in docs
        if (doc["metadata"].get("annotations") or {}).get("helm.sh/hook") == "post-delete"
    ]
    assert {doc["kind"] for doc in hooks} == {
        "ServiceAccount",
        "ClusterRole",
        "RoleBinding",
        "Job",
    }
    [job] = [doc for doc in hooks if doc["kind"] == "Job"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["--uninstall"]
    assert {env["name"]: env["value"] for env in container["env"]}["CRONLOCK_NAMESPACES"] == (
        namespace
    )
    account = ""
    for doc in hooks:
        if doc["kind"] == "Job":
            continue
        if doc["kind"] == "ServiceAccount":
            account = doc["metadata"]["name"]
        try:
            kubernetes.utils.create_from_dict(api, doc, namespace=OPERATOR_NAMESPACE)
        except kubernetes.utils.FailToCreateError as error:
            if not all(e.status == 409 for e in error.api_exceptions):
                raise
    return make_service_account_kubeconfig(controlplane, api, OPERATOR_NAMESPACE, account, tmp_path)


def run_uninstall(controlplane: ControlPlane, kubeconfig: Path, namespace: str) -> Any:
    return subprocess.run(
        [str(Path(sys.executable).parent / "cronlock-operator"), "--uninstall"],
        env={**controlplane.env, "KUBECONFIG": str(kubeconfig), "CRONLOCK_NAMESPACES": namespace},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_uninstall_reverts_every_cronjob_exactly_and_deletes_only_what_cronlock_made(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    operator_kubeconfig: Path,
    tmp_path: Path,
) -> None:
    batch = kubernetes.client.BatchV1Api(api)
    leases = kubernetes.client.CoordinationV1Api(api)
    rbac = kubernetes.client.RbacAuthorizationV1Api(api)
    for name in ("report", "export"):
        batch.create_namespaced_cron_job(
            namespace, make_cronjob(name=name, namespace=None, schedule="0 0 1 1 *")
        )
    batch.create_namespaced_cron_job(
        namespace, make_cronjob(name="plain", namespace=None, annotations={})
    )
    before = {
        name: comparable(read(api, namespace, name)) for name in ("report", "export", "plain")
    }
    leases.create_namespaced_lease(namespace, {"metadata": {"name": "leader"}})
    rbac.create_namespaced_role(
        namespace,
        {"metadata": {"name": "team", "labels": OURS}, "rules": []},  # not a holder Role
    )

    operator = OperatorProcess(operator_kubeconfig, tmp_path / "operator.log", controlplane.env)
    operator.start()
    try:
        for name in ("report", "export"):
            wait_for(lambda name=name: injected(api, namespace, name), 30, f"{name} injected")
        wait_for(
            lambda: (
                {lease.metadata.name for lease in leases.list_namespaced_lease(namespace).items}
                >= {"cronlock-report", "cronlock-export"}
            ),
            30,
            "their Leases",
        )
    finally:
        operator.stop()

    kubeconfig = hook_account(api, controlplane, namespace, tmp_path)
    result = run_uninstall(controlplane, kubeconfig, namespace)

    assert result.returncode == 0, result.stderr
    assert "every CronJob is as its user wrote it" in result.stderr
    for name, stored in before.items():
        assert comparable(read(api, namespace, name)) == stored, name
    assert {lease.metadata.name for lease in leases.list_namespaced_lease(namespace).items} == {
        "leader"
    }
    assert [role.metadata.name for role in rbac.list_namespaced_role(namespace).items] == ["team"]
    assert not [
        binding
        for binding in rbac.list_namespaced_role_binding(namespace).items
        if binding.metadata.name.startswith("cronlock-holder-")
    ]
    # Again: nothing left to do, and nothing else touched.
    again = run_uninstall(controlplane, kubeconfig, namespace)
    assert again.returncode == 0, again.stderr
    for name, stored in before.items():
        assert comparable(read(api, namespace, name)) == stored, name


@pytest.mark.usefixtures("namespace")
def test_without_the_value_the_chart_renders_no_hook(controlplane: ControlPlane) -> None:
    docs = render_chart(controlplane.env)
    assert not [
        doc for doc in docs if (doc["metadata"].get("annotations") or {}).get("helm.sh/hook")
    ]
