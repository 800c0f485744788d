"""The chart installed into a real API server: manifests/install.yaml, restricted pod
security, the ServiceAccount token, the examples, images by digest, the network policy."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from cronlock_operator.settings import images_from
from tests.integration.chart.harness import (
    CHART,
    NON_DEFAULT,
    Install,
    deployment_env,
    dry_run_pod,
    helm,
    label_restricted,
    render,
)
from tests.support.controlplane import ControlPlane
from tests.support.paths import ROOT

INSTALL_YAML = ROOT / "manifests" / "install.yaml"


EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))


REGENERATE = "manifests/render > manifests/install.yaml"


def test_manifests_install_yaml_is_its_namespace_and_the_chart_rendered_with_defaults(
    controlplane: ControlPlane,
) -> None:
    checked_in = INSTALL_YAML.read_text()
    header, namespace, rendered = checked_in.split("---\n", 2)
    fresh = helm(
        controlplane,
        "template",
        "cronlock",
        "charts/cronlock",
        "--namespace",
        "cronlock-system",
        # `helm test`'s Pod is no part of an install: kubectl would run it at once.
        "--skip-tests",
    ).stdout

    assert header.strip(), "manifests/install.yaml lost its header comment"
    assert all(line.startswith("#") for line in header.splitlines())
    # `kubectl apply -f` alone works: the namespace comes first, restricted like the chart's.
    assert yaml.safe_load(namespace) == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": "cronlock-system",
            "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/warn": "restricted",
            },
        },
    }
    assert "---\n" + rendered == fresh, (
        f"manifests/install.yaml is stale; regenerate it from the repository root with:\n"
        f"  {REGENERATE}"
    )


@pytest.mark.timeout(240)
def test_kubectl_apply_of_install_yaml_alone_installs_and_delete_removes_it(
    controlplane: ControlPlane, tmp_path: Path
) -> None:
    # The file as shipped, but for a namespace of its own: cronlock-system here is the
    # other tests' operator's, which a `kubectl delete -f` would take with it. Nothing is
    # made by hand first: the file brings its namespace.
    space = f"cl-install-{secrets.token_hex(3)}"
    text = INSTALL_YAML.read_text()
    assert text.count("cronlock-system") > 10
    manifest = tmp_path / "install.yaml"
    manifest.write_text(text.replace("cronlock-system", space))
    try:
        applied = controlplane.kubectl("apply", "-f", str(manifest))
        assert f"namespace/{space} created" in applied
        assert "deployment.apps/cronlock created" in applied
        assert f"clusterrole.rbac.authorization.k8s.io/cronlock-{space} created" in applied
        labels = controlplane.kubectl(
            "get", "namespace", space, "-o", "jsonpath={.metadata.labels}"
        )
        assert '"pod-security.kubernetes.io/enforce":"restricted"' in labels
        assert controlplane.kubectl("get", "deployment", "cronlock", "-n", space, "-o", "name")
    finally:
        controlplane.kubectl(
            "delete", "-f", str(manifest), "--ignore-not-found", "--wait", "--timeout=180s"
        )
    assert space not in controlplane.kubectl("get", "namespace", "-o", "name")
    assert f"cronlock-{space}" not in controlplane.kubectl("get", "clusterrole", "-o", "name")


def test_pod_security_admission_refuses_a_pod_that_is_not_restricted(
    controlplane: ControlPlane, namespace: str
) -> None:
    label_restricted(controlplane, namespace)
    template = {"spec": {"containers": [{"name": "main", "image": "busybox:1.37"}]}}

    with pytest.raises(AssertionError, match="violates PodSecurity"):
        dry_run_pod(controlplane, namespace, template)


def test_install_with_default_values(
    controlplane: ControlPlane, namespace: str, install: Install
) -> None:
    release = install()
    fullname = f"{release}-cronlock"

    deployment = json.loads(
        controlplane.kubectl("get", "deployment", fullname, "-n", namespace, "-o", "json")
    )
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == fullname
    env = deployment_env(deployment)
    assert env["CRONLOCK_SIDECAR_IMAGES_FROM"] == f"{namespace}/{fullname}"
    assert images_from(deployment) == (
        "ghcr.io/cronlock/cronlock-sidecar:0.1.0",
        "ghcr.io/cronlock/cronlock-sidecar-stores:0.1.0",
    )
    assert env["CRONLOCK_NAMESPACES"] == ""
    assert "CRONLOCK_DEFAULT_RENEW" not in env
    binding = json.loads(
        controlplane.kubectl("get", "clusterrolebinding", f"{fullname}-{namespace}", "-o", "json")
    )
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": fullname, "namespace": namespace}
    ]
    controlplane.kubectl("get", "serviceaccount", fullname, "-n", namespace)
    service = json.loads(
        controlplane.kubectl("get", "service", f"{fullname}-metrics", "-n", namespace, "-o", "json")
    )
    assert [(port["port"], port["targetPort"]) for port in service["spec"]["ports"]] == [
        (8080, "metrics")
    ]
    dry_run_pod(controlplane, namespace, deployment["spec"]["template"])


def test_only_the_operator_container_gets_the_service_account_token(
    controlplane: ControlPlane, namespace: str, install: Install
) -> None:
    """L-N8: the init containers run the sidecar images (by tag in the defaults); with the
    pod-level automount they had the operator's token, and with it its cluster-wide read of
    CronJobs and Jobs. The pod the ReplicaSet creates, as the API server admits it
    (ServiceAccount admission, PodSecurity restricted): the token, the CA and the namespace
    in the operator container alone, at the path its in-cluster config reads."""
    from kubernetes.config import incluster_config

    from cronlock_operator.kube import client

    release = install()
    deployment = json.loads(
        controlplane.kubectl(
            "get", "deployment", f"{release}-cronlock", "-n", namespace, "-o", "json"
        )
    )
    template = deployment["spec"]["template"]
    assert template["spec"]["automountServiceAccountToken"] is False
    pod = json.loads(dry_run_pod(controlplane, namespace, template, "-o", "json"))
    account = Path(incluster_config.SERVICE_TOKEN_FILENAME).parent
    assert account / "namespace" == client._SERVICE_ACCOUNT_NAMESPACE

    def secret_mounts(container: dict[str, Any]) -> list[str]:
        return [
            mount["mountPath"]
            for mount in container.get("volumeMounts", [])
            if mount["mountPath"].startswith("/var/run/secrets")
        ]

    inits = pod["spec"]["initContainers"]
    assert [init["name"] for init in inits] == ["sidecar-image", "sidecar-stores-image"]
    assert [secret_mounts(init) for init in inits] == [[], []]
    [operator] = pod["spec"]["containers"]
    assert secret_mounts(operator) == [str(account)]
    [mount] = [m for m in operator["volumeMounts"] if m["mountPath"] == str(account)]
    assert mount["readOnly"] is True
    volumes = {volume["name"]: volume for volume in pod["spec"]["volumes"]}
    assert not [name for name in volumes if name.startswith("kube-api-access-")]  # no automount
    files: dict[str, str] = {}
    for source in volumes[mount["name"]]["projected"]["sources"]:
        if "serviceAccountToken" in source:
            files[source["serviceAccountToken"]["path"]] = "token"
            assert source["serviceAccountToken"].get("audience") is None  # the API server's
        for item in (source.get("configMap") or {}).get("items", []):
            files[item["path"]] = f"{source['configMap']['name']}/{item['key']}"
        for item in (source.get("downwardAPI") or {}).get("items", []):
            files[item["path"]] = item["fieldRef"]["fieldPath"]
    assert files == {
        Path(incluster_config.SERVICE_TOKEN_FILENAME).name: "token",
        Path(incluster_config.SERVICE_CERT_FILENAME).name: "kube-root-ca.crt/ca.crt",
        "namespace": "metadata.namespace",
    }
    # The template as it was (automount on the pod): the API server mounts the token into
    # both init containers, which is what this check sees.
    before = json.loads(json.dumps(template))
    before["spec"]["automountServiceAccountToken"] = True
    admitted = json.loads(dry_run_pod(controlplane, namespace, before, "-o", "json"))
    assert [secret_mounts(init) for init in admitted["spec"]["initContainers"]] == [
        [str(account)],
        [str(account)],
    ]


def test_install_with_non_default_values(
    controlplane: ControlPlane,
    namespace: str,
    install: Install,
    extra_namespace: Callable[[], str],
) -> None:
    other = extra_namespace()
    release = install({**NON_DEFAULT, "watchNamespaces": [namespace, other]})
    fullname = f"{release}-lock"

    deployment = json.loads(
        controlplane.kubectl("get", "deployment", fullname, "-n", namespace, "-o", "json")
    )
    env = deployment_env(deployment)
    assert env["CRONLOCK_NAMESPACES"] == f"{namespace},{other}"
    assert env["CRONLOCK_LOG_FORMAT"] == "json"
    assert env["CRONLOCK_DEFAULT_RENEW"] == "30s"
    pod = deployment["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == "cronlock-operator"
    assert pod["metadata"]["labels"]["example.com/team"] == "ops"
    assert pod["spec"]["containers"][0]["image"] == (
        "registry.example.com/platform/cronlock:0.1.0-rc.1"
    )
    # The init containers that name the images to inject ask what the operator asks: the
    # pod's request is unchanged, and a quota that wants limits admits them alike.
    [operator] = pod["spec"]["containers"]
    assert operator["resources"]["limits"]["memory"] == "128Mi"  # NON_DEFAULT's
    inits = pod["spec"]["initContainers"]
    assert [init["name"] for init in inits] == ["sidecar-image", "sidecar-stores-image"]
    for init in inits:
        assert init["resources"] == operator["resources"]
        assert init["securityContext"] == operator["securityContext"]
        assert init["imagePullPolicy"] == "Always"
    for space in (namespace, other):
        binding = json.loads(
            controlplane.kubectl("get", "rolebinding", fullname, "-n", space, "-o", "json")
        )
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": f"{fullname}-{namespace}",
        }
    assert "not found" in controlplane.kubectl(
        "get", "clusterrolebinding", f"{fullname}-{namespace}", check=False
    )
    manifest = helm(controlplane, "get", "manifest", release, "-n", namespace).stdout
    assert "kind: ServiceMonitor" not in manifest  # the API is not served here
    notes = helm(controlplane, "get", "notes", release, "-n", namespace).stdout
    assert "no ServiceMonitor was created" in notes
    dry_run_pod(controlplane, namespace, pod)


@pytest.mark.parametrize("example", EXAMPLES, ids=[path.stem for path in EXAMPLES])
def test_the_example_is_accepted_in_a_restricted_namespace(
    controlplane: ControlPlane, namespace: str, example: Path
) -> None:
    label_restricted(controlplane, namespace)

    output = controlplane.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", str(example), check=False
    )

    assert "created (server dry run)" in output, output
    assert "Warning" not in output, output
    assert "error" not in output.lower(), output
    for cronjob in yaml.safe_load_all(example.read_text()):
        assert cronjob["kind"] == "CronJob"
        annotations = cronjob["metadata"]["annotations"]
        assert annotations["cronlock.io/enabled"] == "true"
        template = cronjob["spec"]["jobTemplate"]["spec"]["template"]
        assert {c["image"] for c in template["spec"]["containers"]} == {"busybox:1.37"}
        dry_run_pod(controlplane, namespace, template)


def test_images_by_digest_run_and_their_digest_is_the_only_sidecar_the_policy_admits(
    controlplane: ControlPlane,
) -> None:
    """Security review N12: `image.digest`/`sidecarImage.digest` name the images as
    repository@digest, and the operator's policy admits exactly that sidecar."""
    digest = "sha256:" + "ab" * 32
    docs = render(
        controlplane, "--set", f"image.digest={digest}", "--set", f"sidecarImage.digest={digest}"
    )
    [deployment] = [doc for doc in docs if doc["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"ghcr.io/cronlock/cronlock@{digest}"
    sidecar = f"ghcr.io/cronlock/cronlock-sidecar@{digest}"
    assert images_from(deployment)[0] == sidecar
    [policy] = [
        doc
        for doc in docs
        if doc["kind"] == "ValidatingAdmissionPolicy"
        and doc["metadata"]["name"].endswith("-operator-scope")
    ]
    pinned = [v["expression"] for v in policy["spec"]["validations"] if "image" in v["expression"]]
    # By its digest, from any repository (tests/integration/test_kustomize.py tries it).
    assert any(f'.matches("^[^@]+@{digest}$")' in expression for expression in pinned)
    assert not any("cronlock-sidecar:0.1.0" in expression for expression in pinned)
    assert (
        "does not match"
        in helm(
            controlplane,
            "template",
            "cronlock",
            str(CHART),
            "--set",
            "image.digest=latest",
            check=False,
        ).stderr
    )


def test_the_network_policy_lets_only_the_named_peers_scrape(
    controlplane: ControlPlane, namespace: str
) -> None:
    """Security review N5: with networkPolicy.enabled, /metrics is open only to the release's
    namespace and metricsFrom; the API server accepts the object (enforcing it is the CNI's)."""
    assert not [doc for doc in render(controlplane) if doc["kind"] == "NetworkPolicy"]
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}
    docs = render(
        controlplane,
        "--namespace",
        namespace,
        "--set",
        "networkPolicy.enabled=true",
        "--set-json",
        f"networkPolicy.metricsFrom=[{json.dumps(monitoring)}]",
    )
    [policy] = [doc for doc in docs if doc["kind"] == "NetworkPolicy"]
    metrics, healthz = policy["spec"]["ingress"]
    assert metrics == {
        "ports": [{"port": "metrics", "protocol": "TCP"}],
        "from": [{"podSelector": {}}, monitoring],
    }
    assert healthz == {"ports": [{"port": "healthz", "protocol": "TCP"}]}
    controlplane.kubectl("create", "--dry-run=server", "-f", "-", input_text=json.dumps(policy))
