"""`helm uninstall` with `uninstall.revert`: the chart's post-delete hook runs
`cronlock-operator --uninstall` with the hook's own account. Here it runs as that account
(its rendered RBAC, scoped to the test's namespace) after the operator stopped, as the
hook does once the release is gone."""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from cronlock_operator.cronjob.config import parse_config
from cronlock_operator.injection.build import build_injection
from cronlock_operator.settings import OperatorSettings
from cronlock_sidecar import contract
from tests.support import gen
from tests.support.controlplane import ControlPlane, make_service_account_kubeconfig
from tests.support.kube import run_tool, wait_for
from tests.support.objects import comparable, injected, read, wait_event
from tests.support.operator import (
    CHART,
    OPERATOR_NAMESPACE,
    SIDECAR_IMAGE,
    OperatorProcess,
    render_chart,
)
from tests.support.paths import ROOT

OURS = {"app.kubernetes.io/managed-by": "cronlock"}
POD = "/spec/jobTemplate/spec/template/spec"
ORIGINAL_GRACE = contract.ANNOTATION_ORIGINAL_TERMINATION_GRACE_PERIOD_SECONDS


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
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "Job",
    }
    # No account outlives its hook, failed or not; the Job stays after a failure, for its log.
    for doc in hooks:
        policy = doc["metadata"]["annotations"]["helm.sh/hook-delete-policy"].split(",")
        assert ("hook-failed" in policy) == (doc["kind"] != "Job"), doc["kind"]
    [job] = [doc for doc in hooks if doc["kind"] == "Job"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["--uninstall"]
    assert {env["name"]: env["value"] for env in container["env"]}["CRONLOCK_NAMESPACES"] == (
        namespace
    )
    return create_hooks(api, controlplane, hooks, tmp_path)


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
            namespace, gen.cronjob(name, gen.in_namespace(None), gen.never_due())
        )
    batch.create_namespaced_cron_job(
        namespace, gen.cronjob("plain", gen.in_namespace(None), gen.not_opted_in())
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


@pytest.mark.usefixtures("operator_kubeconfig")  # the release namespace, as helm makes it
def test_the_hooks_account_is_confined_and_an_odd_cronjob_stops_no_other_revert(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    tmp_path: Path,
) -> None:
    """Security review N6: the hook's token may only revert (its policy, made with it), and a
    CronJob-only editor's odd `original-*` value makes the hook name her CronJob and fail,
    not crash before reverting the rest."""
    batch = kubernetes.client.BatchV1Api(api)
    settings = OperatorSettings(sidecar_image=SIDECAR_IMAGE)
    for name in ("report", "squat"):
        body = gen.cronjob(name, gen.in_namespace(namespace), gen.never_due())
        body["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
        injected_body = build_injection(body, parse_config(body, settings), settings)
        if name == "squat":
            injected_body["metadata"]["annotations"][ORIGINAL_GRACE] = "x"
        batch.create_namespaced_cron_job(namespace, injected_body)
    kubeconfig = hook_account(api, controlplane, namespace, tmp_path)
    as_hook = kubernetes.client.BatchV1Api(controlplane.api_client(kubeconfig))

    def refused_now() -> bool:
        try:
            as_hook.patch_namespaced_cron_job(
                "report",
                namespace,
                [{"op": "add", "path": f"{POD}/serviceAccountName", "value": "admin"}],
                _content_type="application/json-patch+json",
                dry_run="All",
            )
        except kubernetes.client.ApiException as error:
            # An earlier test's hook policy (other namespaces) may still be enforced a moment.
            return error.status == 403 and "never changes the account" in str(error.body)
        return False

    wait_for(refused_now, 30, "the hook's own policy to refuse a switch of account")

    result = run_uninstall(controlplane, kubeconfig, namespace)

    # Her one CronJob fails no uninstall (L5): told on it, in the hook's own rights.
    assert result.returncode == 0, result.stderr
    assert f"{namespace}/squat left injected, revert it by hand" in result.stderr
    assert "no NotReverted Event posted" not in result.stderr
    assert not injected(api, namespace, "report"), result.stderr
    assert injected(api, namespace, "squat")
    [told] = wait_event(api, namespace, "squat", "NotReverted")
    assert "could not revert this CronJob" in told


@pytest.mark.usefixtures("namespace")
def test_without_the_value_the_chart_renders_no_hook(controlplane: ControlPlane) -> None:
    docs = render_chart(controlplane.env)
    assert not [
        doc for doc in docs if (doc["metadata"].get("annotations") or {}).get("helm.sh/hook")
    ]


# --- an upgrade that narrows watchNamespaces ----------------------------------------------
def hooks_of_upgrade(controlplane: ControlPlane, release: str, *values: str) -> list[Any]:
    """The post-upgrade hooks `helm upgrade` renders against the cluster (lookup included)."""
    args = ["upgrade", release, str(CHART), "-n", OPERATOR_NAMESPACE, "--dry-run=server"]
    for value in values:
        args += ["--set-json", value]
    output = run_tool(controlplane.env, "helm", *args, timeout=120, cwd=ROOT).stdout
    hooks = output.split("HOOKS:\n", 1)[1].split("MANIFEST:\n", 1)[0]
    return [
        doc
        for doc in yaml.safe_load_all(hooks)
        if doc and doc["metadata"].get("annotations", {}).get("helm.sh/hook") == "post-upgrade"
    ]


@pytest.fixture
def release(controlplane: ControlPlane) -> Iterator[Callable[..., str]]:
    """`helm install` of the chart in the operator's namespace (its pod never runs here)."""
    made: list[str] = []

    def install(*values: str) -> str:
        name = f"narrow-{secrets.token_hex(3)}"
        # --create-namespace: this fixture must not rely on an earlier test having made it
        # (found by running the ring in reverse, CRONLOCK_TEST_ORDER=reverse).
        args = ["install", name, str(CHART), "-n", OPERATOR_NAMESPACE, "--create-namespace"]
        args += ["--wait=false"]
        for value in values:
            args += ["--set-json", value]
        run_tool(controlplane.env, "helm", *args, timeout=120, cwd=ROOT)
        made.append(name)
        return name

    yield install
    for name in made:
        run_tool(
            controlplane.env, "helm", "uninstall", name, "-n", OPERATOR_NAMESPACE,
            check=False, timeout=120, cwd=ROOT,
        )  # fmt: skip


def test_an_upgrade_that_narrows_the_watch_reverts_the_cronjobs_it_stopped_watching(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    operator_kubeconfig: Path,
    release: Callable[..., str],
    tmp_path: Path,
) -> None:
    core = kubernetes.client.CoreV1Api(api)
    batch = kubernetes.client.BatchV1Api(api)
    leases = kubernetes.client.CoordinationV1Api(api)
    kept, dropped = namespace, f"dropped-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": dropped}})
    name = ""
    try:
        for space in (kept, dropped):
            batch.create_namespaced_cron_job(
                space, gen.cronjob("report", gen.in_namespace(None), gen.never_due())
            )
        before = comparable(read(api, dropped, "report"))
        name = release(f"watchNamespaces={json.dumps([kept, dropped])}")
        operator = OperatorProcess(operator_kubeconfig, tmp_path / "operator.log", controlplane.env)
        operator.start()
        try:
            for space in (kept, dropped):
                wait_for(
                    lambda space=space: injected(api, space, "report"), 30, f"{space} injected"
                )
                wait_for(lambda space=space: leases.list_namespaced_lease(space).items, 30, "Lease")
        finally:
            operator.stop()

        # Nothing narrowed, nothing to do.
        assert (
            hooks_of_upgrade(controlplane, name, f"watchNamespaces={json.dumps([kept, dropped])}")
            == []
        )
        hooks = hooks_of_upgrade(controlplane, name, f"watchNamespaces={json.dumps([kept])}")
        assert {(doc["kind"], doc["metadata"].get("namespace")) for doc in hooks} == {
            ("ServiceAccount", OPERATOR_NAMESPACE),
            ("ClusterRole", None),
            ("RoleBinding", dropped),
            ("ValidatingAdmissionPolicy", None),
            ("ValidatingAdmissionPolicyBinding", None),
            ("Job", OPERATOR_NAMESPACE),
        }
        [job] = [doc for doc in hooks if doc["kind"] == "Job"]
        container = job["spec"]["template"]["spec"]["containers"][0]
        assert container["args"] == ["--uninstall", "--revert-only"]
        env = {item["name"]: item["value"] for item in container["env"]}
        assert env["CRONLOCK_NAMESPACES"] == dropped
        [role] = [doc for doc in hooks if doc["kind"] == "ClusterRole"]
        assert role["rules"] == [
            {"apiGroups": ["batch"], "resources": ["cronjobs"], "verbs": ["list", "patch"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        ]

        # The hook's command, with the hook's account: the dropped namespace's CronJob as
        # written, its Lease left for a run in progress; the kept one untouched.
        kubeconfig = create_hooks(api, controlplane, hooks, tmp_path)
        result = subprocess.run(
            [str(Path(sys.executable).parent / "cronlock-operator"), *container["args"]],
            env={**controlplane.env, "KUBECONFIG": str(kubeconfig), **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert comparable(read(api, dropped, "report")) == before
        assert [lease.metadata.name for lease in leases.list_namespaced_lease(dropped).items] == [
            "cronlock-report"
        ]
        assert injected(api, kept, "report")
    finally:
        core.delete_namespace(dropped, propagation_policy="Background")
        # Hook objects are not the release's: helm uninstall leaves them to their hook.
        hook = f"{name}-cronlock-narrowed"
        with contextlib.suppress(kubernetes.client.ApiException):
            kubernetes.client.RbacAuthorizationV1Api(api).delete_cluster_role(hook)
        with contextlib.suppress(kubernetes.client.ApiException):
            core.delete_namespaced_service_account(hook, OPERATOR_NAMESPACE)


def test_narrowing_a_watch_of_every_namespace_reverts_all_but_those_kept(
    namespace: str, controlplane: ControlPlane, release: Callable[..., str]
) -> None:
    name = release()
    hooks = hooks_of_upgrade(controlplane, name, f"watchNamespaces={json.dumps([namespace])}")
    assert {doc["kind"] for doc in hooks} == {
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding", "Job",
    }  # fmt: skip
    [job] = [doc for doc in hooks if doc["kind"] == "Job"]
    env = {
        item["name"]: item["value"]
        for item in job["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert (env["CRONLOCK_NAMESPACES"], env["CRONLOCK_KEEP_NAMESPACES"]) == ("", namespace)
    # Widening, or turning it off, renders none.
    assert hooks_of_upgrade(controlplane, name, "watchNamespaces=[]") == []
    assert (
        hooks_of_upgrade(
            controlplane,
            name,
            f"watchNamespaces={json.dumps([namespace])}",
            "upgrade.revertDropped=false",
        )
        == []
    )


def create_hooks(
    api: kubernetes.client.ApiClient, controlplane: ControlPlane, hooks: list[Any], tmp_path: Path
) -> Path:
    """Create a hook's account and RBAC as helm would (the Job is run by the test itself);
    a kubeconfig with that account's token."""
    account = ""
    for doc in hooks:
        if doc["kind"] == "Job":
            continue
        if doc["kind"] == "ServiceAccount":
            account = doc["metadata"]["name"]
        if doc["kind"].startswith("ValidatingAdmissionPolicy"):
            # Cluster-scoped and named alike in every test: an earlier test's policy names
            # its own namespaces, so it is replaced, as helm's before-hook-creation does.
            registration = kubernetes.client.AdmissionregistrationV1Api(api)
            delete = (
                registration.delete_validating_admission_policy
                if doc["kind"] == "ValidatingAdmissionPolicy"
                else registration.delete_validating_admission_policy_binding
            )
            with contextlib.suppress(kubernetes.client.ApiException):
                delete(doc["metadata"]["name"])
        try:
            kubernetes.utils.create_from_dict(api, doc, namespace=OPERATOR_NAMESPACE)
        except kubernetes.utils.FailToCreateError as error:
            if not all(e.status == 409 for e in error.api_exceptions):
                raise
    return make_service_account_kubeconfig(controlplane, api, OPERATOR_NAMESPACE, account, tmp_path)
