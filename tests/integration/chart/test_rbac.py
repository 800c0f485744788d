"""The chart's RBAC on a real API server: its ServiceAccount may do exactly what the
operator does, where it watches, and the helm tests' account no more than it needs."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from tests.integration.chart.harness import Install, dry_run_pod, kinds, label_restricted, render
from tests.support.controlplane import ControlPlane, ServiceAccountKubeconfig
from tests.support.kube import wait_for
from tests.support.paths import ROOT

# What the operator does (operator/src/cronlock_operator/kube/writes.py and the kopf watches),
# and so exactly what the chart grants.
GRANTED: dict[tuple[str, str], set[str]] = {
    ("batch", "cronjobs"): {"get", "list", "watch", "patch"},
    ("batch", "jobs"): {"get", "list", "watch", "patch", "delete"},
    ("coordination.k8s.io", "leases"): {
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
    },
    ("rbac.authorization.k8s.io", "roles"): {"get", "list", "create", "update", "delete"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"get", "list", "create", "update", "delete"},
    # The pod a Lease's new holder names, by name (review N4: a hold by no run is broken).
    ("", "pods"): {"get"},
    ("", "events"): {"create"},
}


VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


# Cluster-wide, for namespace opt-in (values: namespaceOptIn, on by default): read only.
NAMESPACES_GRANTED = {"get", "list", "watch"}


# (verb, group, resource, namespaced): what a compromised operator must not be able to do.
REFUSED = [
    ("list", "", "secrets", True),
    ("get", "", "secrets", True),
    ("create", "", "pods", True),
    ("list", "", "pods", True),
    ("watch", "", "pods", True),
    ("update", "", "pods", True),
    ("delete", "", "pods", True),
    ("get", "", "configmaps", True),
    ("create", "", "serviceaccounts", True),
    ("create", "batch", "cronjobs", True),
    ("delete", "batch", "cronjobs", True),
    ("update", "batch", "cronjobs", True),
    ("create", "batch", "jobs", True),
    ("escalate", "rbac.authorization.k8s.io", "roles", True),
    ("bind", "rbac.authorization.k8s.io", "roles", True),
    ("patch", "rbac.authorization.k8s.io", "rolebindings", True),
    ("create", "events.k8s.io", "events", True),
    ("update", "apps", "deployments", True),
    ("patch", "", "namespaces", False),
    ("delete", "", "namespaces", False),
    ("create", "rbac.authorization.k8s.io", "clusterroles", False),
    ("create", "rbac.authorization.k8s.io", "clusterrolebindings", False),
    ("list", "apiextensions.k8s.io", "customresourcedefinitions", False),
]


def can(
    client: kubernetes.client.ApiClient, verb: str, group: str, resource: str, **where: str
) -> bool:
    review = kubernetes.client.AuthorizationV1Api(client).create_self_subject_access_review(
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                    **where,
                }
            },
        }
    )
    return bool(review.status.allowed)


def test_helm_tests_account_may_only_list_endpointslices_and_its_pod_is_no_operator(
    controlplane: ControlPlane,
) -> None:
    docs = render(controlplane, tests=True)
    hooks = [d for d in docs if (d["metadata"].get("annotations") or {}).get("helm.sh/hook")]
    assert kinds(hooks) == ["Pod", "Role", "RoleBinding", "ServiceAccount"]
    [role] = [d for d in hooks if d["kind"] == "Role"]
    assert role["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]}
    ]
    [pod] = [d for d in hooks if d["kind"] == "Pod"]
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    labels = pod["metadata"]["labels"]
    assert not selector.items() <= labels.items(), "the test pod would count as the operator"
    [container] = pod["spec"]["containers"]
    assert container["args"] == [
        "--check-metrics",
        f"{pod['metadata']['namespace']}/cronlock-metrics",
        "--check-wait",
        "60s",
    ]
    assert pod["spec"]["serviceAccountName"] == role["metadata"]["name"]
    # What the operator's own pod has: restricted Pod Security (dry-run-admitted elsewhere).
    template = deployment["spec"]["template"]["spec"]
    assert pod["spec"]["securityContext"] == template["securityContext"]
    assert container["securityContext"] == template["containers"][0]["securityContext"]
    for off in ("tests.enabled=false", "metrics.enabled=false"):
        rendered = render(controlplane, "--set", off, tests=True)
        assert not any(d["metadata"]["name"].endswith("-test") for d in rendered), off


def test_watch_namespaces_swap_the_cluster_role_binding_for_role_bindings(
    controlplane: ControlPlane,
) -> None:
    """The namespaced grants; the read of namespaces (namespaceOptIn) is cluster-wide in
    both, bound on its own, and gone with namespaceOptIn=false."""
    cluster = render(controlplane)
    scoped = render(controlplane, "--set-json", 'watchNamespaces=["team-a","team-b"]')
    scoped_only = render(
        controlplane,
        "--set-json",
        'watchNamespaces=["team-a","team-b"]',
        "--set",
        "namespaceOptIn=false",
    )

    def cluster_bindings(docs: list[dict[str, Any]]) -> list[str]:
        return sorted(d["roleRef"]["name"] for d in docs if d["kind"] == "ClusterRoleBinding")

    def role_bindings(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
        """RoleBindings to a ClusterRole (the watch's) or to a Role (its own Deployment's)."""
        return [d for d in docs if d["kind"] == "RoleBinding" and d["roleRef"]["kind"] == kind]

    assert cluster_bindings(cluster) == ["cronlock-default", "cronlock-default-namespaces"]
    assert not role_bindings(cluster, "ClusterRole")
    # In both, the read of its own Deployment, in its own namespace.
    for docs in (cluster, scoped):
        [own] = role_bindings(docs, "Role")
        assert own["roleRef"]["name"] == "cronlock-self"
    assert cluster_bindings(scoped) == ["cronlock-default-namespaces"]
    assert "ClusterRoleBinding" not in kinds(scoped_only)
    [reads] = [
        d
        for d in scoped
        if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-namespaces")
    ]
    assert reads["rules"] == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]}
    ]
    bindings = role_bindings(scoped, "ClusterRole")
    assert sorted(doc["metadata"]["namespace"] for doc in bindings) == ["team-a", "team-b"]


def test_the_service_account_may_do_exactly_what_the_operator_does_everywhere(
    controlplane: ControlPlane,
    namespace: str,
    install: Install,
    service_account_kubeconfig: ServiceAccountKubeconfig,
) -> None:
    release = install()
    client = controlplane.api_client(service_account_kubeconfig(namespace, f"{release}-cronlock"))

    for space in (namespace, "some-other-namespace"):
        for (group, resource), verbs in GRANTED.items():
            for verb in VERBS:
                allowed = can(client, verb, group, resource, namespace=space)
                assert allowed == (verb in verbs), f"{verb} {group}/{resource} in {space}"
    # kopf watches CronJobs, Jobs and Leases across namespaces in one request each.
    for group, resource in (
        ("batch", "cronjobs"),
        ("batch", "jobs"),
        ("coordination.k8s.io", "leases"),
    ):
        assert can(client, "watch", group, resource)
    for verb in VERBS:
        assert can(client, verb, "", "namespaces") == (verb in NAMESPACES_GRANTED), verb
    # Its own Deployment, to read the images it injects from its init containers: get alone.
    fullname = f"{release}-cronlock"
    for verb in VERBS:
        mine = can(client, verb, "apps", "deployments", namespace=namespace, name=fullname)
        assert mine == (verb == "get"), verb
    assert not can(client, "get", "apps", "deployments", namespace=namespace, name="other")
    for verb, group, resource, namespaced in REFUSED:
        where = {"namespace": namespace} if namespaced else {}
        assert not can(client, verb, group, resource, **where), f"{verb} {group}/{resource}"


def test_with_watch_namespaces_the_service_account_may_act_only_there(
    controlplane: ControlPlane,
    namespace: str,
    install: Install,
    extra_namespace: Callable[[], str],
    service_account_kubeconfig: ServiceAccountKubeconfig,
) -> None:
    """And with namespaceOptIn off, nothing cluster-scoped at all: not even reading
    namespaces."""
    other = extra_namespace()
    release = install({"watchNamespaces": [namespace, other], "namespaceOptIn": False})
    client = controlplane.api_client(service_account_kubeconfig(namespace, f"{release}-cronlock"))

    for (group, resource), verbs in GRANTED.items():
        for verb in VERBS:
            for space in (namespace, other):
                allowed = can(client, verb, group, resource, namespace=space)
                assert allowed == (verb in verbs), f"{verb} {group}/{resource} in {space}"
            assert not can(client, verb, group, resource, namespace="unwatched")
        assert not can(client, "list", group, resource)  # cluster-wide
    for verb in VERBS:
        assert not can(client, verb, "", "namespaces"), verb
    for verb, group, resource, namespaced in REFUSED:
        where = {"namespace": namespace} if namespaced else {}
        assert not can(client, verb, group, resource, **where), f"{verb} {group}/{resource}"


@pytest.mark.timeout(180)
def test_the_operator_as_the_charts_service_account_injects_and_reverts(
    controlplane: ControlPlane,
    api: kubernetes.client.ApiClient,
    namespace: str,
    install: Install,
    service_account_kubeconfig: ServiceAccountKubeconfig,
    tmp_path: Path,
) -> None:
    release = install({"watchNamespaces": [namespace]})
    kubeconfig = service_account_kubeconfig(namespace, f"{release}-cronlock")
    cronjob = yaml.safe_load((ROOT / "manifests" / "examples" / "basic.yaml").read_text())
    batch = kubernetes.client.BatchV1Api(api)
    batch.create_namespaced_cron_job(namespace, cronjob)
    log_path = tmp_path / "operator.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "cronlock-operator"),
                "--namespace",
                namespace,
                "--metrics-port",
                "0",
                "--liveness",
                "",
            ],
            env={**controlplane.env, "KUBECONFIG": str(kubeconfig)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def template() -> dict[str, Any]:
            body = batch.read_namespaced_cron_job("report", namespace)
            result: dict[str, Any] = api.sanitize_for_serialization(body)
            return result["spec"]["jobTemplate"]["spec"]["template"]

        def init_names() -> list[str]:
            return [c["name"] for c in template()["spec"].get("initContainers") or []]

        wait_for(lambda: "cronlock" in init_names(), 60, "the operator to inject the CronJob")
        lease = controlplane.kubectl("get", "lease", "cronlock-report", "-n", namespace)
        assert "cronlock-report" in lease
        assert "cronlock-holder" in controlplane.kubectl("get", "role", "-n", namespace)
        # The injected pod too passes restricted pod security.
        label_restricted(controlplane, namespace)
        dry_run_pod(controlplane, namespace, template())

        controlplane.kubectl(
            "annotate", "cronjob", "report", "-n", namespace, "cronlock.io/enabled-"
        )
        wait_for(lambda: not init_names(), 60, "the operator to revert the CronJob")
        events = controlplane.kubectl("get", "events", "-n", namespace)
        assert "Injected" in events
        assert "Reverted" in events
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    output = log_path.read_text(errors="replace")
    # Without the lines' timestamps, whose milliseconds can read 403 too.
    messages = re.sub(r"(?m)^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", "", output)
    assert "403" not in messages, output[-3000:]
    assert "Forbidden" not in messages, output[-3000:]
