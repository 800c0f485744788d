"""The source install as docs/INSTALL.md gives it, on the real node with a real registry
(`crane registry serve`) standing for registry.example.com: the images its `make image`
block names (the archives the ring built through that same target) pushed there under
those names and no other, then its `helm install` block as written. The operator's pod
pulls its image and both init containers', the operator guards a run, and the run pulls
the sidecar from the registry. And an image the docs' install names but nobody pushed
(the stores image, as INSTALL.md before issue 54 left it) says so in one line: the pod's
`Failed to pull image` Event names it, and the chart's NOTES name the value that sets it."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from tests.support.controlplane import ControlPlane
from tests.support.helm import RESTRICTED
from tests.support.kube import run_tool, wait_for
from tests.support.node import RealNode
from tests.support.papers import IMAGE_VALUES, built_images, run_shell, source_install
from tests.support.paths import CACHE, ROOT
from tests.support.runs import guard_and_run
from tests.support.tools import gotool

ARCHIVES = Path(os.environ.get("CRONLOCK_IMAGES_DIR") or CACHE / "images" / "out")
# What each of `make image`'s variables builds, as tests/controlplane/images archived it.
ARCHIVE_OF = {
    "IMAGE": "cronlock.tar",
    "SIDECAR_IMAGE": "cronlock-sidecar.tar",
    "SIDECAR_STORES_IMAGE": "cronlock-sidecar-stores.tar",
}
DOCS_REGISTRY = "registry.example.com"


def on_registry(registry: str) -> dict[str, str]:
    """The images INSTALL.md's `make image` block builds, by make variable, on `registry`."""
    named = built_images()
    assert set(named) <= set(ARCHIVE_OF), f"make image sets {sorted(named)}"
    return {key: ref.replace(DOCS_REGISTRY, registry) for key, ref in named.items()}


def push(archive: Path, ref: str, tmp_path: Path) -> str:
    """The OCI archive pushed to `ref` (the registry's plain HTTP); its digest."""
    layout = tmp_path / archive.stem
    layout.mkdir()
    subprocess.run(["tar", "-xf", str(archive), "-C", str(layout)], check=True, timeout=120)
    crane = gotool("crane")
    subprocess.run(
        [crane, "push", "--insecure", str(layout), ref],
        check=True,
        capture_output=True,
        timeout=300,
    )
    # An image of its own (one config label more), not the very image the other node tests
    # run as localhost/...:dev with imagePullPolicy Never: once the kubelet has pulled an
    # image from a registry it no longer counts as preloaded, and since Kubernetes 1.35
    # (KubeletEnsureSecretPulledImages) a pod naming it by another reference with policy
    # Never gets ErrImageNeverPull ("not present", seen here: every later chart install
    # on the node failed).
    subprocess.run(
        [crane, "mutate", "--insecure", "--label", f"cronlock.test/pushed-as={ref}", ref],
        check=True,
        capture_output=True,
        timeout=300,
    )
    digest = subprocess.run(
        [crane, "digest", "--insecure", ref], check=True, capture_output=True, text=True, timeout=60
    )
    return digest.stdout.strip()


def install_as_documented(
    controlplane: ControlPlane, registry: str, space: str, watched: str
) -> str:
    """INSTALL.md's `helm install` block on `registry`, into `space`, watching `watched`;
    helm's output (the chart's NOTES)."""
    command = source_install(space, watched).replace(DOCS_REGISTRY, registry)
    return run_shell(command, controlplane.env, ROOT, timeout=240)


def operator_pod(api: kubernetes.client.ApiClient, space: str) -> Any:
    """The release's one operator pod."""
    (pod,) = (
        kubernetes.client.CoreV1Api(api)
        .list_namespaced_pod(space, label_selector="app.kubernetes.io/instance=cronlock")
        .items
    )
    return pod


def uninstall(controlplane: ControlPlane, space: str) -> None:
    run_tool(
        controlplane.env, "helm", "uninstall", "cronlock", "-n", space, "--wait",
        check=False, timeout=240,
    )  # fmt: skip
    controlplane.kubectl("delete", "namespace", space, "--ignore-not-found", "--wait=false")


@pytest.mark.timeout(900)
def test_the_documented_source_install_starts_the_operator_and_guards_a_run(
    controlplane: ControlPlane,
    api: kubernetes.client.ApiClient,
    namespace: str,
    node: RealNode,
    tmp_path: Path,
) -> None:
    controlplane.kubectl("label", "namespace", namespace, "--overwrite", *RESTRICTED)
    registry = f"{node.registry}/src-{secrets.token_hex(3)}"
    images = on_registry(registry)
    assert set(images) == set(ARCHIVE_OF), "INSTALL.md builds all three images"
    digests = {key: push(ARCHIVES / ARCHIVE_OF[key], ref, tmp_path) for key, ref in images.items()}
    space = f"cl-src-{secrets.token_hex(3)}"
    try:
        notes = install_as_documented(controlplane, registry, space, namespace)
        for key, ref in images.items():
            assert re.search(rf"^ +{IMAGE_VALUES[key]} +{re.escape(ref)}$", notes, re.M), notes
        rollout = ("rollout", "status", "deployment/cronlock", "-n", space, "--timeout=300s")
        run_tool(controlplane.env, "kubectl", *rollout, timeout=360)
        core = kubernetes.client.CoreV1Api(api)
        pod = operator_pod(api, space)
        pulled = {
            status.name: status.image_id
            for status in pod.status.init_container_statuses + pod.status.container_statuses
        }
        assert pulled.keys() == {"sidecar-image", "sidecar-stores-image", "operator"}
        expected = {
            "operator": digests["IMAGE"],
            "sidecar-image": digests["SIDECAR_IMAGE"],
            "sidecar-stores-image": digests["SIDECAR_STORES_IMAGE"],
        }
        assert all(pulled[name].endswith(expected[name]) for name in pulled), pulled
        # Ready is not logged yet: the line may come a moment after the rollout ends.
        said = f"sidecar images from deployment {space}/cronlock: {images['SIDECAR_IMAGE']}"
        wait_for(
            lambda: (
                said in core.read_namespaced_pod_log(pod.metadata.name, space, container="operator")
            ),
            60,
            "the operator to log the images it read",
        )
        guard_and_run(api, namespace, images["SIDECAR_IMAGE"], digests["SIDECAR_IMAGE"])
    finally:
        uninstall(controlplane, space)


@pytest.mark.timeout(600)
def test_an_image_the_install_names_but_nobody_pushed_is_named_in_one_event(
    controlplane: ControlPlane,
    api: kubernetes.client.ApiClient,
    namespace: str,
    node: RealNode,
    tmp_path: Path,
) -> None:
    """INSTALL.md before issue 54: two images built and pushed, the chart's default stores
    image kept (here: named on the registry, never pushed)."""
    registry = f"{node.registry}/half-{secrets.token_hex(3)}"
    images = on_registry(registry)
    missing = images["SIDECAR_STORES_IMAGE"]
    for key in ("IMAGE", "SIDECAR_IMAGE"):
        push(ARCHIVES / ARCHIVE_OF[key], images[key], tmp_path)
    space = f"cl-half-{secrets.token_hex(3)}"
    try:
        notes = install_as_documented(controlplane, registry, space, namespace)
        assert re.search(rf"^ +sidecarStoresImage +{re.escape(missing)}$", notes, re.M), notes
        core = kubernetes.client.CoreV1Api(api)

        def told() -> list[str]:
            events = core.list_namespaced_event(space).items
            return [
                event.message
                for event in events
                if event.reason == "Failed"
                and event.involved_object.field_path == "spec.initContainers{sidecar-stores-image}"
                and f'Failed to pull image "{missing}"' in (event.message or "")
            ]

        wait_for(told, 180, f"a Failed Event naming {missing}")

        def waiting() -> dict[str, str | None]:
            return {
                status.name: status.state.waiting.reason if status.state.waiting else None
                for status in operator_pod(api, space).status.init_container_statuses
            }

        # The kubelet posts the Event before its next status sync says the same.
        wait_for(
            lambda: waiting()["sidecar-stores-image"] in ("ErrImagePull", "ImagePullBackOff"),
            60,
            "the pod's status to say the stores image cannot be pulled",
        )
        pod = operator_pod(api, space)
        assert not any(status.ready for status in pod.status.container_statuses or [])
    finally:
        uninstall(controlplane, space)
