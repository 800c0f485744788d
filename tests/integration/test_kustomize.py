"""Kustomize's `images:` on install.yaml (issue 44 item 5), with the kustomize built into the
real kubectl and the real API server: a release's install.yaml names its images by digest;
an overlay that moves all three to a mirror (`newName`, digests kept) moves the operator's
image and the two init containers that name what it injects; the operator, as the
install's own ServiceAccount, reads them from its Deployment and injects the mirror's
sidecar; the install's own operator policy, unchanged by Kustomize, admits it because it
pins the content (the digest), not where it is pulled from; and the same token cannot
inject another digest, a tag, or read any Deployment but its own."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from cronlock_operator.settings import images_from
from tests.support import gen
from tests.support.controlplane import ControlPlane, ServiceAccountKubeconfig
from tests.support.kube import wait_for
from tests.support.objects import batch, has_sidecar, read
from tests.support.operator import CHART, OperatorProcess
from tests.support.paths import ROOT

DIGEST = {
    "cronlock": "sha256:" + "1" * 64,
    "cronlock-sidecar": "sha256:" + "2" * 64,
    "cronlock-sidecar-stores": "sha256:" + "3" * 64,
}
VALUES = {
    "cronlock": "image",
    "cronlock-sidecar": "sidecarImage",
    "cronlock-sidecar-stores": "sidecarStoresImage",
}
MIRROR = "mirror.example.com:5000/platform"
RENDER = ROOT / "manifests" / "render"
INIT_POD = "/spec/jobTemplate/spec/template/spec/initContainers"


def release_install_yaml(controlplane: ControlPlane, space: str) -> str:
    """install.yaml as a release renders it (manifests/render, its images by digest as the
    release's chart defaults name them), for namespace `space`."""
    digests = [
        arg for name, key in VALUES.items() for arg in ("--set", f"{key}.digest={DIGEST[name]}")
    ]
    rendered = subprocess.run(
        [str(RENDER), str(CHART), *digests],
        env=controlplane.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return rendered.replace("cronlock-system", space)


def kinds(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    """The objects of one kind, by name (Kustomize reorders them)."""
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == kind}


def spaced(node: Any) -> Any:
    """`node` with every run of whitespace in its strings made one space."""
    if isinstance(node, str):
        return " ".join(node.split())
    if isinstance(node, dict):
        return {key: spaced(value) for key, value in node.items()}
    if isinstance(node, list):
        return [spaced(value) for value in node]
    return node


def images(docs: list[dict[str, Any]]) -> set[str]:
    """Every image of every container and init container, in any object."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("containers", "initContainers") and isinstance(value, list):
                    found.update(c["image"] for c in value if isinstance(c, dict) and "image" in c)
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(docs)
    return found


@pytest.mark.timeout(240)
def test_kustomize_images_move_every_image_and_the_operator_and_its_policy_follow(
    controlplane: ControlPlane,
    api: kubernetes.client.ApiClient,
    namespace: str,
    tmp_path: Path,
    service_account_kubeconfig: ServiceAccountKubeconfig,
) -> None:
    space = f"cl-kz-{secrets.token_hex(3)}"
    (tmp_path / "install.yaml").write_text(release_install_yaml(controlplane, space))
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["install.yaml"],
        # What a mirror's user writes: new names, the digests kept.
        "images": [
            {"name": f"ghcr.io/cronlock/{name}", "newName": f"{MIRROR}/{name}"} for name in DIGEST
        ],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    before = [doc for doc in yaml.safe_load_all((tmp_path / "install.yaml").read_text()) if doc]
    built = controlplane.kubectl("kustomize", str(tmp_path))
    docs = [doc for doc in yaml.safe_load_all(built) if doc]

    # Every image moved, by digest; the policies are as rendered (Kustomize's YAML writer
    # re-folds the long CEL expressions, adding line breaks: whitespace, to CEL).
    assert images(docs) == {f"{MIRROR}/{name}@{digest}" for name, digest in DIGEST.items()}
    assert images(before) == {f"ghcr.io/cronlock/{n}@{d}" for n, d in DIGEST.items()}
    policies = [spaced(kinds(built, "ValidatingAdmissionPolicy")) for built in (docs, before)]
    assert policies[0] == policies[1]
    [deployment] = kinds(docs, "Deployment").values()
    sidecar = f"{MIRROR}/cronlock-sidecar@{DIGEST['cronlock-sidecar']}"
    stores = f"{MIRROR}/cronlock-sidecar-stores@{DIGEST['cronlock-sidecar-stores']}"
    assert images_from(deployment) == (sidecar, stores)

    applied = tmp_path / "applied.yaml"
    applied.write_text(built)
    operator: OperatorProcess | None = None
    try:
        controlplane.kubectl("apply", "-f", str(applied))
        kubeconfig = service_account_kubeconfig(space, "cronlock")
        operator = OperatorProcess(
            kubeconfig,
            tmp_path / "operator.log",
            controlplane.env,
            args=["--namespace", namespace, "--sidecar-images-from", f"{space}/cronlock"],
        )
        operator.start()
        assert f"sidecar images from deployment {space}/cronlock: {sidecar}, " in operator.log()

        body = gen.cronjob("report", gen.in_namespace(namespace), gen.restart_policy("Never"))
        batch(api).create_namespaced_cron_job(namespace, body)
        wait_for(lambda: has_sidecar(read(api, namespace, "report")), 30, "report injected")
        pod = read(api, namespace, "report")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        injected = {c["name"]: c["image"] for c in pod["initContainers"]}
        assert injected == {"cronlock-gate": sidecar, "cronlock": sidecar}

        # The install's own token, as a stolen one: the digest is pinned, a tag or another
        # digest is refused; where the pinned content comes from is not the policy's to say.
        operator.stop()
        as_operator = batch(controlplane.api_client(kubeconfig))
        index = [c["name"] for c in pod["initContainers"]].index("cronlock")

        def set_image(image: str) -> None:
            as_operator.patch_namespaced_cron_job(
                "report",
                namespace,
                [{"op": "replace", "path": f"{INIT_POD}/{index}/image", "value": image}],
            )

        for image in (
            f"{MIRROR}/cronlock-sidecar:0.1.0",
            f"{MIRROR}/cronlock-sidecar@sha256:{'4' * 64}",
            f"{MIRROR}/cronlock-sidecar@{DIGEST['cronlock']}",  # the operator's own image
        ):
            with pytest.raises(kubernetes.client.ApiException) as caught:
                set_image(image)
            assert caught.value.status == 403, caught.value.body
            assert "run only the configured sidecar image" in str(caught.value.body)
        set_image(f"elsewhere.example.com/copy@{DIGEST['cronlock-sidecar']}")

        # Its own Deployment, read; no other, and no list.
        apps = kubernetes.client.AppsV1Api(controlplane.api_client(kubeconfig))
        assert apps.read_namespaced_deployment("cronlock", space).metadata.name == "cronlock"
        refused: list[Callable[[], Any]] = [
            lambda: apps.read_namespaced_deployment("other", space),
            lambda: apps.list_namespaced_deployment(space),
            lambda: apps.read_namespaced_deployment("cronlock", namespace),
        ]
        for call in refused:
            with pytest.raises(kubernetes.client.ApiException) as caught:
                call()
            assert caught.value.status == 403
    finally:
        if operator is not None:
            operator.stop()
        controlplane.kubectl(
            "delete", "-f", str(applied), "--ignore-not-found", "--wait", "--timeout=180s"
        )


def test_an_operator_whose_deployment_names_no_sidecar_image_exits_saying_so(
    controlplane: ControlPlane, api: kubernetes.client.ApiClient, namespace: str
) -> None:
    """A Deployment without the init container (a hand-edited install), or none at all:
    exit 78 with a line that names what is missing, before any CronJob is touched."""
    kubernetes.client.AppsV1Api(api).create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": "bare"},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": "bare"}},
                "template": {
                    "metadata": {"labels": {"app": "bare"}},
                    "spec": {"containers": [{"name": "operator", "image": "op:1"}]},
                },
            },
        },
    )
    for ref, says in (
        (f"{namespace}/bare", "has no init container 'sidecar-image'"),
        (f"{namespace}/absent", "--sidecar-images-from: get deployment"),
        ("no-slash", "is not NAMESPACE/NAME"),
    ):
        exited = subprocess.run(
            [
                str(Path(sys.executable).parent / "cronlock-operator"),
                *("--metrics-port", "0", "--liveness", "", "--namespace", namespace),
                *("--sidecar-images-from", ref),
            ],
            env=dict(controlplane.env, KUBECONFIG=str(controlplane.kubeconfig)),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert exited.returncode == 78, exited.stderr
        assert says in exited.stderr, exited.stderr
        assert "cronlock operator started" not in exited.stderr
