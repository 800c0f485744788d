"""The chart's watched namespaces and admission policies: where the mutating and Lease
policies apply, overlapping releases refused, a missing namespace named."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Callable

import pytest

from tests.integration.chart.harness import CHART, helm, kinds, render
from tests.support.controlplane import ControlPlane


def test_the_mutating_policy_is_rendered_only_where_served_and_bound_to_the_watch(
    controlplane: ControlPlane,
) -> None:
    served = ("--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy")
    policy = {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}
    assert policy <= set(kinds(render(controlplane, *served)))
    assert not policy & set(kinds(render(controlplane)))  # before 1.36: not served
    off = render(controlplane, *served, "--set", "admissionPolicy.onFailureToNever=false")
    assert not policy & set(kinds(off))
    scoped = render(controlplane, *served, "--set", "watchNamespaces={reports,exports}")
    [binding] = [doc for doc in scoped if doc["kind"] == "MutatingAdmissionPolicyBinding"]
    [term] = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert term == {
        "key": "kubernetes.io/metadata.name",
        "operator": "In",
        "values": ["reports", "exports"],
    }


def test_a_release_whose_watch_overlaps_another_is_refused_and_disjoint_ones_coexist(
    controlplane: ControlPlane, namespace: str, extra_namespace: Callable[[], str]
) -> None:
    # The same release name in two namespaces: once collided on every cluster-scoped name.
    other, team_x, team_y = extra_namespace(), extra_namespace(), extra_namespace()
    release = f"cl-{secrets.token_hex(3)}"

    def install(where: str, *watch: str, verb: str = "install") -> subprocess.CompletedProcess[str]:
        scope = ("--set-json", f"watchNamespaces={json.dumps(list(watch))}") if watch else ()
        return helm(
            controlplane,
            verb,
            release,
            str(CHART),
            "-n",
            where,
            "--wait=false",
            *scope,
            check=False,
        )

    first = install(namespace, team_x)
    assert first.returncode == 0, first.stderr
    try:
        everywhere = install(other)
        assert everywhere.returncode != 0
        assert (
            f'cronlock release "{release}" in namespace {namespace} already runs an operator '
            f"watching {team_x}; this release would watch {team_x} too"
        ) in everywhere.stderr
        assert "Give each release disjoint watchNamespaces" in everywhere.stderr

        disjoint = install(other, team_y)
        assert disjoint.returncode == 0, disjoint.stderr
        roles = controlplane.kubectl("get", "clusterrole", "-o", "name").split()
        assert {
            f"clusterrole.rbac.authorization.k8s.io/{release}-cronlock-{namespace}",
            f"clusterrole.rbac.authorization.k8s.io/{release}-cronlock-{other}",
        } <= set(roles)

        # A release's own upgrade is not refused by itself; one onto the other's is.
        assert install(namespace, team_x, verb="upgrade").returncode == 0
        onto = install(other, team_y, team_x, verb="upgrade")
        assert onto.returncode != 0
        assert f"this release would watch {team_x} too" in onto.stderr
    finally:
        for where in (namespace, other):
            helm(controlplane, "uninstall", release, "-n", where, check=False)


@pytest.mark.parametrize(
    ("enabled", "holders", "rendered"),
    [(True, True, True), (False, True, True), (True, False, True), (False, False, False)],
)
def test_freezes_are_guarded_whenever_either_lease_policy_is_on(
    controlplane: ControlPlane, enabled: bool, holders: bool, rendered: bool
) -> None:
    """Security review L9: with the operator's policy off but the holders' on, a pod on the
    account could write any freeze; the freeze and freezers' policies and the freezer role
    now come with either policy (and with neither, no freezer role is offered)."""
    docs = render(
        controlplane,
        "--set",
        f"admissionPolicy.enabled={str(enabled).lower()}",
        "--set",
        f"admissionPolicy.holders={str(holders).lower()}",
    )
    names = {doc["metadata"]["name"] for doc in docs}
    expected = {
        "cronlock-default-lease-freeze",
        "cronlock-default-freezers",
        "cronlock-default-freezer",
    }
    assert (expected <= names) is rendered, sorted(names)
    if not rendered:
        assert not expected & names


def test_a_watched_namespace_that_does_not_exist_is_named_with_what_to_do(
    controlplane: ControlPlane, namespace: str
) -> None:
    """Not helm's bare `namespaces "x" not found` from the RoleBinding, half-installed."""
    release = f"cl-{secrets.token_hex(3)}"
    missing = f"nowhere-{secrets.token_hex(3)}"
    result = helm(
        controlplane,
        "install",
        release,
        str(CHART),
        "-n",
        namespace,
        "--wait=false",
        "--set-json",
        f'watchNamespaces=["{namespace}", "{missing}"]',
        check=False,
    )
    try:
        assert result.returncode != 0
        assert f"watchNamespaces names {missing}, which does not exist in this cluster" in (
            result.stderr
        )
        assert f"kubectl create namespace {missing}" in result.stderr
        listed = helm(controlplane, "list", "-n", namespace, "-q").stdout.split()
        assert release not in listed
    finally:
        helm(controlplane, "uninstall", release, "-n", namespace, check=False)
