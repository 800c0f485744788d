"""docs/INSTALL.md's source install on the real API server: its `helm install` block, run
as written, names exactly the images its `make image` block builds, in the operator's pod
(the operator's container and the two init containers it reads the sidecars from); the
chart's NOTES list each with the value that sets it; and the operator, run as the
release's ServiceAccount with its Deployment's environment, starts injecting them. Pulling
them is the e2e ring's (tests/e2e/test_source_install.py): this ring has no node."""

from __future__ import annotations

import re
import secrets
from pathlib import Path

import kubernetes
import pytest

from tests.support.controlplane import ControlPlane
from tests.support.kube import run_tool
from tests.support.operator import start_release_operator
from tests.support.papers import IMAGE_VALUES, built_images, run_shell, source_install
from tests.support.paths import ROOT

CONTAINER_OF = {
    "IMAGE": "operator",
    "SIDECAR_IMAGE": "sidecar-image",
    "SIDECAR_STORES_IMAGE": "sidecar-stores-image",
}


@pytest.mark.timeout(300)
def test_the_documented_install_runs_the_images_the_documented_build_makes(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    tmp_path: Path,
) -> None:
    built = built_images()
    assert built.keys() == IMAGE_VALUES.keys(), f"make image builds {sorted(built)}"
    space = f"cl-src-{secrets.token_hex(3)}"
    try:
        notes = run_shell(source_install(space, namespace), controlplane.env, ROOT, timeout=180)
        for key, ref in built.items():
            line = rf"^ +{IMAGE_VALUES[key]} +{re.escape(ref)}$"
            assert re.search(line, notes, re.M), f"NOTES lack {line}:\n{notes}"

        pod = (
            kubernetes.client.AppsV1Api(api)
            .read_namespaced_deployment("cronlock", space)
            .spec.template.spec
        )
        images = {c.name: c.image for c in pod.init_containers + pod.containers}
        assert images == {CONTAINER_OF[key]: ref for key, ref in built.items()}

        operator = start_release_operator(api, controlplane, space, "cronlock", tmp_path)
        operator.stop()
        told = (
            f"sidecar images from deployment {space}/cronlock: {built['SIDECAR_IMAGE']}, "
            f"stores {built['SIDECAR_STORES_IMAGE']}"
        )
        assert told in operator.log(), operator.log()[-3000:]
    finally:
        run_tool(
            controlplane.env, "helm", "uninstall", "cronlock", "-n", space,
            check=False, timeout=120,
        )  # fmt: skip
        controlplane.kubectl("delete", "namespace", space, "--ignore-not-found", "--wait=false")
