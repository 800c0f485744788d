"""docs/INSTALL.md's source install on the real API server: its `helm install` block, run
as written, names exactly the images its `make image` block builds, in the operator's pod
(the operator's container and the two init containers it reads the sidecars from); the
chart's NOTES list each with the value that sets it; and the operator, run as the
release's ServiceAccount with its Deployment's environment, starts injecting them. Pulling
them is the e2e ring's (tests/e2e/test_source_install.py): this ring has no node."""

from __future__ import annotations

import re
import secrets
import subprocess
from pathlib import Path

import kubernetes
import pytest

from tests.support.controlplane import ControlPlane
from tests.support.kube import run_tool
from tests.support.operator import start_release_operator
from tests.support.papers import marked_block
from tests.support.paths import ROOT

INSTALL_MD = ROOT / "docs" / "INSTALL.md"
VALUE_OF = {"IMAGE": "image", "SIDECAR_IMAGE": "sidecarImage"}
VALUE_OF["SIDECAR_STORES_IMAGE"] = "sidecarStoresImage"
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
    built = dict(re.findall(r"\b([A-Z_]+)=(\S+)", marked_block(INSTALL_MD, "build-images")))
    assert built.keys() == VALUE_OF.keys(), f"make image builds {sorted(built)}"
    install = marked_block(INSTALL_MD, "source-install")
    assert install.startswith("helm install cronlock charts/cronlock -n cronlock-system "), install
    space = f"cl-src-{secrets.token_hex(3)}"
    # Only what scopes it to this test: its own namespace, and the one it watches.
    command = install.replace("cronlock-system", space)
    command += f" \\\n  --set 'watchNamespaces={{{namespace}}}'"
    try:
        result = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", command],
            env=controlplane.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
        for key, ref in built.items():
            line = rf"^ +{VALUE_OF[key]} +{re.escape(ref)}$"
            assert re.search(line, result.stdout, re.M), f"NOTES lack {line}:\n{result.stdout}"

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
