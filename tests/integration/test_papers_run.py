"""The papers' shell blocks run as a user pastes them (issue 54, item 1), on the real API
server with the chart's RBAC and the real operator: Helm installs and upgrades of the real
chart, kubectl, `kubectl cronlock` and `cronlock-sidecar run`. Each block is read from its
paper (`<!-- tested: NAME -->`), so a block that changes is what runs next; only the names
that scope it to a test are replaced (its namespaces, the release's namespace), and each
replacement must find what it replaces. What each block promises is then checked on the
cluster. No node here: a pod never runs (the e2e ring's tests run those blocks)."""

from __future__ import annotations

import base64
import os
import re
import secrets
import shlex
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import redis
import yaml

from cronlock_sidecar import contract
from tests.support import gen
from tests.support.controlplane import ControlPlane
from tests.support.kube import run_tool, wait_for
from tests.support.objects import batch, injected, read
from tests.support.operator import SIDECAR_STORES_IMAGE, SIDECAR_VALUES
from tests.support.papers import INSTALL_MD, marked_block, run_shell, source_install
from tests.support.paths import ROOT, SIDECAR
from tests.support.stores import RedisServer

README = ROOT / "README.md"
USAGE = ROOT / "docs" / "USAGE.md"
STORES = ROOT / "docs" / "STORES.md"
UPGRADING = ROOT / "docs" / "UPGRADING.md"
ENABLED = "cronlock.io/enabled"
MANAGED = {"app.kubernetes.io/managed-by": "cronlock"}


def scoped(block: str, replacing: dict[str, str]) -> str:
    """`block` with each name that stands for the user's replaced by the test's; each must
    occur, or the paper changed under the test."""
    for old, new in replacing.items():
        assert old in block, f"the block no longer names {old!r}:\n{block}"
        block = block.replace(old, new)
    return block


def console_commands(block: str) -> list[str]:
    """The commands of a `console` block: its `$ ` lines, without the prompt."""
    commands = [line[2:] for line in block.splitlines() if line.startswith("$ ")]
    assert commands, f"no `$ ` line in:\n{block}"
    return commands


@pytest.fixture
def env(controlplane: ControlPlane) -> dict[str, str]:
    """The control plane's environment with this venv's commands first on PATH, as a user
    who installed cronlock has them (`cronlock`, `kubectl-cronlock`, `cronlock-sidecar`)."""
    return dict(controlplane.env, PATH=f"{SIDECAR.parent}{os.pathsep}{controlplane.env['PATH']}")


def new_namespace(api: kubernetes.client.ApiClient, stem: str) -> Iterator[str]:
    name = f"{stem}-{secrets.token_hex(3)}"
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def other_namespace(api: kubernetes.client.ApiClient) -> Iterator[str]:
    yield from new_namespace(api, "doc-other")


@pytest.fixture
def third_namespace(api: kubernetes.client.ApiClient) -> Iterator[str]:
    yield from new_namespace(api, "doc-third")


@pytest.fixture
def release_namespace(controlplane: ControlPlane) -> Iterator[str]:
    """The namespace a block's release goes to instead of cronlock-system (where the
    ring's own chart RBAC lives); the release is uninstalled afterwards."""
    space = f"cl-doc-{secrets.token_hex(3)}"
    yield space
    run_tool(
        controlplane.env, "helm", "uninstall", "cronlock", "-n", space, check=False, timeout=120
    )
    controlplane.kubectl("delete", "namespace", space, "--ignore-not-found", "--wait=false")


def deployment(api: kubernetes.client.ApiClient, space: str) -> Any:
    return kubernetes.client.AppsV1Api(api).read_namespaced_deployment("cronlock", space)


def container_env(api: kubernetes.client.ApiClient, space: str) -> dict[str, str]:
    pod = deployment(api, space).spec.template.spec
    operator = next(c for c in pod.containers if c.name == "operator")
    # An empty value is left out of the API's answer: "" here.
    return {item.name: item.value or "" for item in operator.env or []}


def may(controlplane: ControlPlane, space: str, verb: str, resource: str, where: str) -> str:
    """`kubectl auth can-i` for the release's operator account: yes or no."""
    account = (
        kubernetes.client.AppsV1Api(controlplane.api_client())
        .read_namespaced_deployment("cronlock", space)
        .spec.template.spec.service_account_name
    )
    answer = controlplane.kubectl(
        "auth", "can-i", verb, resource, "-n", where,
        f"--as=system:serviceaccount:{space}:{account}", check=False,
    )  # fmt: skip
    return answer.split()[0]


# --- Installs ------------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_readme_install_watching_two_namespaces(
    api: kubernetes.client.ApiClient,
    controlplane: ControlPlane,
    env: dict[str, str],
    namespace: str,
    other_namespace: str,
    third_namespace: str,
    release_namespace: str,
) -> None:
    block = scoped(
        marked_block(README, "readme-watch-namespaces"),
        {
            "cronlock-system": release_namespace,
            "{reports,exports}": f"{{{namespace},{other_namespace}}}",
        },
    )
    run_shell(block, env, ROOT, timeout=180)
    assert container_env(api, release_namespace)["CRONLOCK_NAMESPACES"].split(",") == [
        namespace,
        other_namespace,
    ]
    # Its permissions confined to them: it may patch CronJobs there and nowhere else.
    assert may(controlplane, release_namespace, "patch", "cronjobs.batch", namespace) == "yes"
    assert may(controlplane, release_namespace, "patch", "cronjobs.batch", other_namespace) == "yes"
    assert may(controlplane, release_namespace, "patch", "cronjobs.batch", third_namespace) == "no"


@pytest.mark.timeout(240)
def test_install_with_values_on_the_command_line(
    api: kubernetes.client.ApiClient,
    env: dict[str, str],
    namespace: str,
    other_namespace: str,
    release_namespace: str,
) -> None:
    block = scoped(
        marked_block(INSTALL_MD, "install-values"),
        {
            "cronlock-system": release_namespace,
            '"team-a","team-b"': f'"{namespace}","{other_namespace}"',
        },
    )
    run_shell(block, env, ROOT, timeout=180)
    operator = container_env(api, release_namespace)
    assert operator["CRONLOCK_NAMESPACES"].split(",") == [namespace, other_namespace]
    assert operator["CRONLOCK_LOG_FORMAT"] == "json"


@pytest.mark.timeout(240)
def test_openshift_install_leaves_the_ids_to_the_platform(
    api: kubernetes.client.ApiClient,
    env: dict[str, str],
    namespace: str,
    release_namespace: str,
) -> None:
    block = scoped(
        marked_block(INSTALL_MD, "install-openshift"), {"cronlock-system": release_namespace}
    )
    # Scoped to this test's namespace, as the other tests' releases are.
    run_shell(f"{block} \\\n  --set 'watchNamespaces={{{namespace}}}'", env, ROOT, timeout=180)
    pod = api.sanitize_for_serialization(deployment(api, release_namespace).spec.template.spec)
    ids = {"runAsUser", "runAsGroup", "fsGroup"}
    assert not ids & set(pod.get("securityContext") or {}), pod.get("securityContext")
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        assert not ids & set(container.get("securityContext") or {}), container
    # ... nor do the containers it injects: empty is "unset" to the operator.
    settings = container_env(api, release_namespace)
    assert settings["CRONLOCK_SIDECAR_RUN_AS_USER"] == "", settings
    assert settings["CRONLOCK_SIDECAR_RUN_AS_GROUP"] == "", settings


@pytest.mark.timeout(420)
def test_upgrade_with_your_values_again(
    api: kubernetes.client.ApiClient,
    controlplane: ControlPlane,
    env: dict[str, str],
    namespace: str,
    other_namespace: str,
    release_namespace: str,
    tmp_path: Path,
) -> None:
    run_shell(source_install(release_namespace, namespace), env, ROOT, timeout=180)
    # my-values.yaml: the user's values, in the directory the upgrade runs in, beside
    # charts/ (a clone's).
    (tmp_path / "charts").symlink_to(ROOT / "charts")
    images = dict(value.split("=", 1) for value in SIDECAR_VALUES)
    values: dict[str, Any] = {"watchNamespaces": [namespace, other_namespace]}
    for key, value in images.items():
        section, field = key.split(".")
        values.setdefault(section, {})[field] = value
    (tmp_path / "my-values.yaml").write_text(yaml.safe_dump(values))
    block = scoped(marked_block(INSTALL_MD, "upgrade"), {"cronlock-system": release_namespace})
    run_shell(block, env, tmp_path, timeout=300)

    history = run_tool(
        controlplane.env, "helm", "history", "cronlock", "-n", release_namespace, "-o", "json"
    ).stdout
    # The install, then one revision for each of the block's two upgrades.
    assert [entry["revision"] for entry in yaml.safe_load(history)] == [1, 2, 3]
    # The second upgrade kept the first one's values on the new chart's defaults.
    operator = container_env(api, release_namespace)
    assert operator["CRONLOCK_NAMESPACES"].split(",") == [namespace, other_namespace]
    pod = deployment(api, release_namespace).spec.template.spec
    images_in_pod = {c.image for c in pod.init_containers}
    assert SIDECAR_STORES_IMAGE in images_in_pod, images_in_pod


# --- After uninstalling -------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_leftovers_are_listed_and_deleted(
    api: kubernetes.client.ApiClient, env: dict[str, str], namespace: str
) -> None:
    leases = kubernetes.client.CoordinationV1Api(api)
    rbac = kubernetes.client.RbacAuthorizationV1Api(api)
    leases.create_namespaced_lease(
        namespace, {"metadata": {"name": "cronlock-report", "labels": MANAGED}, "spec": {}}
    )
    leases.create_namespaced_lease(namespace, {"metadata": {"name": "not-ours"}, "spec": {}})
    rbac.create_namespaced_role(
        namespace, {"metadata": {"name": "cronlock-holder-default", "labels": MANAGED}}
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "cronlock-holder-default", "labels": MANAGED},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "cronlock-holder-default",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}],
        },
    )
    # Every namespace (-A) in the paper; this test's alone here, as other tests' run on.
    block = scoped(marked_block(INSTALL_MD, "leftovers"), {" -A ": f" -n {namespace} "})
    output = run_shell(block, env, ROOT, timeout=60)
    for kind, name in (
        ("lease.coordination.k8s.io", "cronlock-report"),
        ("role.rbac.authorization.k8s.io", "cronlock-holder-default"),
        ("rolebinding.rbac.authorization.k8s.io", "cronlock-holder-default"),
    ):
        assert f"{kind}/{name} " in output, output  # listed
        assert f'{kind} "{name}" deleted' in output, output
    assert [lease.metadata.name for lease in leases.list_namespaced_lease(namespace).items] == [
        "not-ours"
    ]
    assert (
        rbac.list_namespaced_role(namespace, label_selector="app.kubernetes.io/managed-by").items
        == []
    )


# --- Using it -----------------------------------------------------------------------------


def lock_in_a_store(
    api: kubernetes.client.ApiClient, env: dict[str, str], namespace: str, block: str
) -> None:
    """The store's Secret and annotations, as `block` writes them onto CronJob nightly: the
    operator injects the sidecar with the store clients."""
    batch(api).create_namespaced_cron_job(
        namespace, gen.cronjob("nightly", gen.in_namespace(None), gen.not_opted_in())
    )
    block = scoped(block, {"-n reports ": f"-n {namespace} "})
    run_shell(block, env, ROOT, timeout=60)
    secret = kubernetes.client.CoreV1Api(api).read_namespaced_secret("team-locks", namespace)
    assert (
        base64.b64decode(secret.data["url"]).decode() == "rediss://:PASSWORD@redis.example:6380/0"
    )
    wait_for(lambda: injected(api, namespace, "nightly"), 60, "the operator to inject nightly")
    cronjob = read(api, namespace, "nightly")
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    sidecar = next(c for c in pod["initContainers"] if c["name"] == contract.SIDECAR_CONTAINER)
    assert sidecar["image"] == SIDECAR_STORES_IMAGE


@pytest.mark.usefixtures("operator")
@pytest.mark.timeout(120)
def test_readme_one_lock_across_clusters(
    api: kubernetes.client.ApiClient, env: dict[str, str], namespace: str
) -> None:
    lock_in_a_store(api, env, namespace, marked_block(README, "readme-store"))


@pytest.mark.usefixtures("operator")
@pytest.mark.timeout(120)
def test_stores_lock_named_on_the_cronjob(
    api: kubernetes.client.ApiClient, env: dict[str, str], namespace: str
) -> None:
    lock_in_a_store(api, env, namespace, marked_block(STORES, "store-secret"))


@pytest.mark.usefixtures("operator")
@pytest.mark.timeout(180)
def test_a_namespace_opted_in_then_out(
    api: kubernetes.client.ApiClient, env: dict[str, str], namespace: str
) -> None:
    # The label guards no CronJob whose pods run as `default` (USAGE.md): an account each.
    kubernetes.client.CoreV1Api(api).create_namespaced_service_account(
        namespace, {"metadata": {"name": "runner"}}
    )
    for name in ("nightly", "adhoc"):
        batch(api).create_namespaced_cron_job(
            namespace,
            gen.cronjob(
                name, gen.in_namespace(None), gen.not_opted_in(), gen.service_account("runner")
            ),
        )
    block = scoped(marked_block(USAGE, "namespace-opt-in"), {"team-a": namespace})
    lines = block.splitlines()
    assert len(lines) == 3, block

    def guarded(name: str) -> bool:
        return injected(api, namespace, name)

    run_shell(lines[0], env, ROOT, timeout=30)
    for name in ("nightly", "adhoc"):
        wait_for(lambda n=name: guarded(n), 60, f"{name} injected by the label")  # type: ignore[misc]
    run_shell(lines[1], env, ROOT, timeout=30)
    wait_for(lambda: not guarded("adhoc"), 60, "adhoc reverted by its own annotation")
    assert guarded("nightly")
    run_shell(lines[2], env, ROOT, timeout=30)
    wait_for(lambda: not guarded("nightly"), 60, "nightly reverted once the label went")
    assert read(api, namespace, "adhoc")["metadata"]["annotations"] == {ENABLED: "false"}


def lease_notes(api: kubernetes.client.ApiClient, namespace: str, lock: str) -> dict[str, str]:
    lease = kubernetes.client.CoordinationV1Api(api).read_namespaced_lease(
        contract.lease_name(lock), namespace
    )
    return {
        key: value
        for key, value in (lease.metadata.annotations or {}).items()
        if key in contract.FREEZE_NOTES
    }


@pytest.mark.usefixtures("operator")
@pytest.mark.timeout(180)
def test_freeze_a_lock_for_maintenance(
    api: kubernetes.client.ApiClient, env: dict[str, str], namespace: str
) -> None:
    batch(api).create_namespaced_cron_job(
        namespace, gen.cronjob("billing", gen.in_namespace(None), gen.never_due())
    )
    wait_for(lambda: injected_with_lease(api, namespace, "billing"), 60, "billing's Lease")
    block = marked_block(USAGE, "freeze")
    # The paper's `--until` is a date a user picks, at most 31 days ahead: a day from now
    # here, so that the block does not expire with the calendar.
    (date,) = re.findall(r"--until (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) ", block)
    later = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    block = scoped(block, {"-n reports": f"-n {namespace}", date: later})
    lines = block.splitlines()
    assert len(lines) == 4, block
    until = f"{contract.PREFIX}frozen-until"
    run_shell(lines[0], env, ROOT, timeout=60)
    first = lease_notes(api, namespace, "billing")
    assert first[f"{contract.PREFIX}frozen-reason"] == "billing DB migration", first
    run_shell(lines[1], env, ROOT, timeout=60)
    assert lease_notes(api, namespace, "billing")[until].startswith(later.removesuffix("Z"))
    run_shell(lines[2], env, ROOT, timeout=60)
    assert lease_notes(api, namespace, "billing") == {}
    shown = run_shell(lines[3], env, ROOT, timeout=60)
    assert yaml.safe_load(shown)["metadata"]["name"] == "cronlock-billing"


def injected_with_lease(api: kubernetes.client.ApiClient, namespace: str, name: str) -> bool:
    try:
        kubernetes.client.CoordinationV1Api(api).read_namespaced_lease(
            contract.lease_name(name), namespace
        )
    except kubernetes.client.ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


@pytest.mark.usefixtures("operator")
@pytest.mark.timeout(120)
def test_the_right_to_freeze_given_in_one_namespace(
    env: dict[str, str], controlplane: ControlPlane, namespace: str, other_namespace: str
) -> None:
    def may_freeze(space: str) -> str:
        return controlplane.kubectl(
            "auth", "can-i", "freeze", "leases.coordination.k8s.io",
            "-n", space, "--as", "alice", check=False,
        ).split()[0]  # fmt: skip

    assert may_freeze(namespace) == "no", "alice may freeze before the binding"
    block = scoped(marked_block(USAGE, "freezers"), {"-n reports": f"-n {namespace}"})
    run_shell(block, env, ROOT, timeout=60)
    assert may_freeze(namespace) == "yes"
    assert may_freeze(other_namespace) == "no"


@pytest.mark.timeout(120)
def test_the_lock_outside_the_operator(
    api: kubernetes.client.ApiClient, env: dict[str, str], namespace: str, tmp_path: Path
) -> None:
    script = tmp_path / "make-report.sh"
    script.write_text('#!/bin/sh\necho "report made with token $CRONLOCK_FENCING_TOKEN" > made\n')
    script.chmod(0o755)
    block = scoped(marked_block(USAGE, "run-outside"), {"reports/": f"{namespace}/"})
    run_shell(block, env, tmp_path, timeout=90)
    assert (tmp_path / "made").read_text().startswith("report made with token ")
    lease = kubernetes.client.CoordinationV1Api(api).read_namespaced_lease(
        "cronlock-report", namespace
    )
    assert not lease.spec.holder_identity, "given back when the command ended"


@pytest.mark.usefixtures("operator")
@pytest.mark.timeout(120)
def test_what_you_then_see(
    api: kubernetes.client.ApiClient,
    controlplane: ControlPlane,
    env: dict[str, str],
    namespace: str,
    tmp_path: Path,
) -> None:
    batch(api).create_namespaced_cron_job(namespace, gen.cronjob("report", gen.in_namespace(None)))
    wait_for(lambda: injected_with_lease(api, namespace, "report"), 60, "report's Lease")
    # The paper's reader works in the namespace `reports`: a kubeconfig whose context is in
    # this test's, for the command that names none.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(Path(controlplane.env["KUBECONFIG"]).read_text())
    reader = dict(env, KUBECONFIG=str(kubeconfig))
    run_tool(reader, "kubectl", "config", "set-context", "--current", f"--namespace={namespace}")
    commands = console_commands(marked_block(USAGE, "what-you-see"))
    assert len(commands) == 3, commands
    block = scoped("\n".join(commands), {"-n reports": f"-n {namespace}"})
    output = run_shell(block, reader, ROOT, timeout=60)
    assert "cronlock-report" in output, output  # the Lease
    assert "Injected" in output, output  # the CronJob's Events
    assert re.search(r"(?m)^CRONJOB +LOCK +HOLDER", output), output  # cronlock status
    assert re.search(r"(?m)^report +report ", output), output


@pytest.mark.timeout(60)
def test_the_version_skew_events_are_listed(env: dict[str, str]) -> None:
    (command,) = console_commands(marked_block(UPGRADING, "skew-events"))
    # The selector is one the API server takes; the Events themselves: tests/e2e/test_upgrade.py.
    result = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", command],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "No resources found" in result.stderr or "SidecarVersionSkew" in result.stdout


@pytest.mark.timeout(120)
def test_argocd_health_check_patched_in(
    api: kubernetes.client.ApiClient, env: dict[str, str], namespace: str
) -> None:
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "argocd-cm"}, "data": {"url": "https://argocd.example"}}
    )
    block = scoped(marked_block(USAGE, "argocd-health"), {"-n argocd ": f"-n {namespace} "})
    run_shell(block, env, ROOT, timeout=60)
    data = core.read_namespaced_config_map("argocd-cm", namespace).data
    patch = yaml.safe_load((ROOT / "manifests" / "argocd" / "argocd-cm-patch.yaml").read_text())
    key = "resource.customizations.health.batch_CronJob"
    assert data[key] == patch["data"][key]
    assert data["url"] == "https://argocd.example", "Argo CD's own settings kept"


def test_scoped_refuses_a_block_that_no_longer_names_what_it_replaces() -> None:
    with pytest.raises(AssertionError, match="no longer names"):
        scoped("kubectl get lease -n team-b", {"team-a": "x"})
    assert shlex.split(scoped("helm -n cronlock-system", {"cronlock-system": "y"})) == [
        "helm",
        "-n",
        "y",
    ]


@pytest.mark.timeout(300)
def test_install_with_kubectl(
    api: kubernetes.client.ApiClient,
    controlplane: ControlPlane,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    # manifests/install.yaml for another namespace than cronlock-system (the ring's chart
    # RBAC is there, and the file's cluster-wide names carry its namespace), in a clone's
    # layout.
    space = f"cl-kubectl-{secrets.token_hex(3)}"
    install = tmp_path / "manifests" / "install.yaml"
    install.parent.mkdir()
    install.write_text(
        (ROOT / "manifests" / "install.yaml").read_text().replace("cronlock-system", space)
    )
    try:
        output = run_shell(marked_block(INSTALL_MD, "install-kubectl"), env, tmp_path, timeout=120)
        documents = [doc for doc in yaml.safe_load_all(install.read_text()) if doc]
        assert len(output.splitlines()) == len(documents), output  # one line per object
        # Every object is on the server as the file has it.
        listed = run_tool(env, "kubectl", "get", "-f", str(install), "-o", "name").stdout
        assert len(listed.split()) == len(documents), listed
        labels = kubernetes.client.CoreV1Api(api).read_namespace(space).metadata.labels
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted", labels
        assert deployment(api, space).spec.template.spec.service_account_name
    finally:
        run_tool(
            env, "kubectl", "delete", "-f", str(install), "--ignore-not-found", "--wait=false",
            check=False, timeout=120,
        )  # fmt: skip


@pytest.mark.timeout(120)
def test_freeze_a_lock_in_a_store(
    api: kubernetes.client.ApiClient, env: dict[str, str], namespace: str, redis_store: RedisServer
) -> None:
    kubernetes.client.CoreV1Api(api).create_namespaced_secret(
        namespace, {"metadata": {"name": "team-locks"}, "stringData": {"url": redis_store.url}}
    )
    block = scoped(marked_block(USAGE, "freeze-in-store"), {"-n reports": f"-n {namespace}"})
    lines = block.splitlines()
    assert len(lines) == 2, block
    stored = {k: v for k, v in env.items() if k != "KUBECONFIG"}
    stored["CRONLOCK_STORE"] = redis_store.url
    lock = f"{namespace}/{contract.lease_name('ledger')}"

    def run_on_the_lock() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SIDECAR), "run", "--lease", lock, "--", "true"],
            env=stored, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    frozen = run_shell(lines[0], env, ROOT, timeout=60)
    assert frozen.strip().endswith(": restore drill"), frozen
    skipped = run_on_the_lock()
    assert skipped.returncode == contract.EXIT_SKIPPED, skipped.stderr
    assert "restore drill; skipping this run" in skipped.stderr
    run_shell(lines[1], env, ROOT, timeout=60)
    ran = run_on_the_lock()
    assert ran.returncode == 0, ran.stderr


@pytest.mark.timeout(600)  # pip builds the package and fetches the Redis client
def test_a_store_outside_kubernetes(
    controlplane: ControlPlane, redis_store: RedisServer, tmp_path: Path
) -> None:
    """STORES.md's `run --store` from a fresh clone, its `pip install` into a virtualenv
    of its own: the command takes the lock in the real Redis and runs the work."""
    clone = tmp_path / "clone"
    subprocess.run(
        ["git", "clone", "--quiet", "--local", str(ROOT), str(clone)], check=True, timeout=120
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    (clone / "make-report.sh").write_text('#!/bin/sh\necho "report made" > made\n')
    (clone / "make-report.sh").chmod(0o755)
    env = {k: v for k, v in controlplane.env.items() if k != "KUBECONFIG"}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    lease = f"doc-{secrets.token_hex(3)}/nightly"
    block = scoped(
        marked_block(STORES, "run-store"),
        {"rediss://:PASSWORD@redis.example:6380/0": redis_store.url, "reports/nightly": lease},
    )
    run_shell(block, env, clone, timeout=540)
    assert (clone / "made").read_text() == "report made\n"
    # The lock was the store's: the installed sidecar took it there and gave it back.
    client = redis.Redis.from_url(redis_store.url)
    try:
        keys = [key.decode() for key in client.scan_iter(match=f"*{lease.split('/')[0]}*")]
    finally:
        client.close()
    assert keys, "no key of the lock in Redis"
