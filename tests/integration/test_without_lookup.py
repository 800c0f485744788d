"""The chart's install-time checks, without Helm `lookup` (Argo CD renders with
`helm template`, and `kubectl apply` of a rendered chart asks nothing):

- one operator per CronJob: a release's policy refuses another release's operator
  Deployment whose watch overlaps its own, naming the release that was there first; a
  disjoint release and the release's own Deployment pass;
- a watched namespace that does not exist: the apply fails on the RoleBinding there, naming
  the namespace, and the operator says what is missing and what to do instead of starting.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.controlplane import ControlPlane, ServiceAccountKubeconfig
from tests.support.kube import run_tool, wait_for
from tests.support.operator import CHART, OperatorProcess, kube_version


def rendered(
    controlplane: ControlPlane, release: str, namespace: str, watch: list[str], *values: str
) -> list[dict[str, Any]]:
    """`helm template` of a release, as Argo CD renders it (no cluster, no lookup)."""
    args = ["helm", "template", release, str(CHART), "--namespace", namespace]
    args += ["--kube-version", kube_version(), "--skip-tests"]
    args += ["--set", "admissionPolicy.oneOperator=true"]
    for value in values:
        args += ["--set", value]
    if watch:
        args += ["--set", "watchNamespaces={" + ",".join(watch) + "}"]
    result = subprocess.run(args, env=controlplane.env, capture_output=True, text=True, check=True)
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [found] = [doc for doc in docs if doc["kind"] == "Deployment"]
    return found


def dry_run(
    controlplane: ControlPlane, namespace: str, body: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    return run_tool(
        controlplane.env,
        "kubectl", "apply", "--dry-run=server", "-n", namespace, "-f", "-",
        input_text=json.dumps(body),
        check=False,
    )  # fmt: skip


class First:
    """The release installed first: its name, namespace, and its operator Deployment."""

    def __init__(self, name: str, namespace: str, docs: list[dict[str, Any]]) -> None:
        self.name = name
        self.namespace = namespace
        self.deployment = deployment(docs)


def install_first(controlplane: ControlPlane, namespace: str, watch: list[str]) -> Iterator[First]:
    """Release `first-…` in `namespace`: only its one-operator policy is created (its
    Deployment need not run for the policy to judge others)."""
    name = f"first-{secrets.token_hex(3)}"
    docs = rendered(controlplane, name, namespace, watch)
    policy = [
        doc
        for doc in docs
        if doc["kind"].startswith("ValidatingAdmissionPolicy")
        and doc["metadata"]["name"].endswith("-one-operator")
    ]
    assert [doc["kind"] for doc in policy] == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    text = yaml.safe_dump_all(policy)
    controlplane.kubectl("apply", "-f", "-", input_text=text)
    probe = deployment(rendered(controlplane, "probe", namespace, []))
    wait_for(
        # Refused by this policy, not an earlier test's on its way out.
        lambda: (
            f"cronlock release {name} in namespace"
            in dry_run(controlplane, namespace, probe).stderr
        ),
        timeout=30,
        what="the one-operator policy to be enforced",
    )
    yield First(name, namespace, docs)
    controlplane.kubectl("delete", "-f", "-", "--wait=false", input_text=text)


@pytest.fixture
def team() -> str:
    return f"team-{secrets.token_hex(3)}"


@pytest.fixture
def first_watching_a_team(controlplane: ControlPlane, namespace: str, team: str) -> Iterator[First]:
    yield from install_first(controlplane, namespace, [team, "shared-ns"])


@pytest.fixture
def first_watching_everything(controlplane: ControlPlane, namespace: str) -> Iterator[First]:
    yield from install_first(controlplane, namespace, [])


@pytest.mark.timeout(120)
def test_a_second_release_whose_watch_overlaps_is_refused_naming_the_first(
    controlplane: ControlPlane, namespace: str, team: str, first_watching_a_team: First
) -> None:
    first = first_watching_a_team
    overlapping = deployment(rendered(controlplane, "second", namespace, [team, "other"]))
    refused = dry_run(controlplane, namespace, overlapping)
    assert refused.returncode != 0, refused.stdout
    assert (
        f"cronlock release {first.name} in namespace {namespace} already runs an operator "
        f"watching {team}, shared-ns; this release (second in namespace {namespace}) would "
        f"watch {team} too, and two operators would reconcile the same CronJobs. Give each "
        "release disjoint watchNamespaces, or upgrade that release instead."
    ) in refused.stderr
    # A second release watching every namespace overlaps too.
    everything = deployment(rendered(controlplane, "second", namespace, []))
    refused = dry_run(controlplane, namespace, everything)
    assert refused.returncode != 0, refused.stdout
    assert f"would watch {team}, shared-ns too" in refused.stderr, refused.stderr
    # A disjoint release, and the first release's own Deployment (its upgrades), pass.
    disjoint = dry_run(
        controlplane, namespace, deployment(rendered(controlplane, "second", namespace, ["other"]))
    )
    assert disjoint.returncode == 0, disjoint.stderr
    own = dry_run(controlplane, namespace, first.deployment)
    assert own.returncode == 0, own.stderr


@pytest.mark.timeout(120)
def test_a_release_watching_everything_admits_no_other(
    controlplane: ControlPlane, namespace: str, team: str, first_watching_everything: First
) -> None:
    second = deployment(rendered(controlplane, "second", namespace, [team]))
    refused = dry_run(controlplane, namespace, second)
    assert refused.returncode != 0, refused.stdout
    assert "already runs an operator watching every namespace" in refused.stderr, refused.stderr
    assert f"would watch {team} too" in refused.stderr, refused.stderr
    # The same release name in another namespace is another release.
    same_name = rendered(controlplane, first_watching_everything.name, "default", [team])
    elsewhere = dry_run(controlplane, "default", deployment(same_name))
    assert elsewhere.returncode != 0, elsewhere.stdout
    assert "would watch " + team in elsewhere.stderr, elsewhere.stderr


RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")


@pytest.mark.timeout(180)
def test_a_watched_namespace_that_does_not_exist_is_named_by_the_apply_and_the_operator(
    controlplane: ControlPlane,
    namespace: str,
    service_account_kubeconfig: ServiceAccountKubeconfig,
    tmp_path: Path,
) -> None:
    missing = f"missing-{secrets.token_hex(3)}"
    release = f"rel-{secrets.token_hex(3)}"
    docs = rendered(controlplane, release, namespace, [namespace, missing], "namespaceOptIn=false")
    text = yaml.safe_dump_all([doc for doc in docs if doc["kind"] in RBAC_KINDS])
    applied = run_tool(
        controlplane.env, "kubectl", "apply", "-f", "-", input_text=text, check=False
    )
    try:
        assert applied.returncode != 0
        assert f'namespaces "{missing}" not found' in applied.stderr
        kubeconfig = service_account_kubeconfig(namespace, f"{release}-cronlock")
        operator = OperatorProcess(
            kubeconfig,
            tmp_path / "operator.log",
            controlplane.env,
            args=["--namespace", namespace, "--namespace", missing, "--no-namespace-opt-in"],
        )
        operator.start(until=f"this operator has no RoleBinding in namespace {missing}")
        operator.stop()
        log = operator.log()
        assert "cronlock operator started" not in log
        assert (
            f"list cronjobs in namespace {missing}: HTTP 403 Forbidden: this operator has no "
            f"RoleBinding in namespace {missing}. If {missing} did not exist when the release "
            "was installed or synced, its RoleBinding there could not be made: create "
            f"namespace {missing} and sync (or helm upgrade) the release again, or remove it "
            "from watchNamespaces"
        ) in log
    finally:
        run_tool(
            controlplane.env,
            "kubectl", "delete", "--ignore-not-found", "--wait=false", "-f", "-",
            input_text=text,
            check=False,
        )  # fmt: skip
