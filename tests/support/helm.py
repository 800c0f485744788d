"""The Helm chart on the real node, as a user installs it: `helm install --wait` into a
restricted namespace watching it, with the images the tests built (never pulled)."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import kubernetes

from tests.support import gen
from tests.support.controlplane import ControlPlane
from tests.support.kube import run_tool, wait_for
from tests.support.node import CRONLOCK_IMAGE
from tests.support.objects import injected
from tests.support.operator import SIDECAR_IMAGE, SIDECAR_STORES_IMAGE
from tests.support.paths import ROOT

CHART = ROOT / "charts" / "cronlock"
RESTRICTED = (
    "pod-security.kubernetes.io/enforce=restricted",
    "pod-security.kubernetes.io/warn=restricted",
)
# Long enough for a loaded machine to start the operator; the failing case waits it out.
TEST_WAIT = "15s"


def helm(
    controlplane: ControlPlane, *args: str, check: bool = True, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return run_tool(controlplane.env, "helm", *args, check=check, timeout=timeout, cwd=ROOT)


def guard(api: kubernetes.client.ApiClient, namespace: str, name: str) -> None:
    """A CronJob opted in, injected by the chart's operator with its Lease."""
    batch = kubernetes.client.BatchV1Api(api)
    batch.create_namespaced_cron_job(namespace, gen.cronjob(name, gen.in_namespace(None)))
    wait_for(lambda: injected(api, namespace, name), 60, "the chart's operator to inject")
    leases = kubernetes.client.CoordinationV1Api(api)
    wait_for(
        lambda: any(
            lease.metadata.name == f"cronlock-{name}"
            for lease in leases.list_namespaced_lease(namespace).items
        ),
        30,
        "the chart's operator to create the Lease",
    )


def image_values(operator_image: str, sidecar_image: str, namespace: str) -> list[str]:
    """`--set` arguments for these images and the stores image built here (the operator's
    pod runs all three: the sidecar images as init containers), pulled never, and the
    release watching `namespace` alone."""
    repository, tag = operator_image.rsplit(":", 1)
    sidecar_repository, sidecar_tag = sidecar_image.rsplit(":", 1)
    stores_repository, stores_tag = SIDECAR_STORES_IMAGE.rsplit(":", 1)
    values = [
        f"image.repository={repository},image.tag={tag},image.pullPolicy=Never",
        f"sidecarImage.repository={sidecar_repository},sidecarImage.tag={sidecar_tag}",
        f"sidecarStoresImage.repository={stores_repository},sidecarStoresImage.tag={stores_tag}",
        f"sidecarImage.pullPolicy=Never,watchNamespaces={{{namespace}}},tests.wait={TEST_WAIT}",
    ]
    return [arg for value in values for arg in ("--set", value)]


def install(
    controlplane: ControlPlane,
    namespace: str,
    *values: str,
    chart: Path = CHART,
    images: tuple[str, str] = (CRONLOCK_IMAGE, SIDECAR_IMAGE),
    restricted: bool = True,
) -> tuple[str, str]:
    """`chart` installed into a namespace, restricted unless not `restricted` (the
    namespace's other pods may then be any), watching it, with `images` (operator, sidecar)
    and `values` (--set) on top. (release, fullname)"""
    if restricted:
        controlplane.kubectl("label", "namespace", namespace, "--overwrite", *RESTRICTED)
    name = f"cl-{secrets.token_hex(3)}"
    extra = [arg for value in values for arg in ("--set", value)]
    helm(
        controlplane,
        "install",
        name,
        str(chart),
        "-n",
        namespace,
        *image_values(*images, namespace),
        *extra,
        "--wait",
        "--timeout",
        "180s",
    )
    return name, f"{name}-cronlock"


# The previous release (tests/controlplane/previous-release): its commit, and the images
# tests/controlplane/images built from its Dockerfile.
PREVIOUS_PIN = ROOT / "tests" / "controlplane" / "previous-release"
PREVIOUS_IMAGES = ("localhost/cronlock:previous", "localhost/cronlock-sidecar:previous")


def previous_commit() -> str:
    for line in PREVIOUS_PIN.read_text().splitlines():
        if line.startswith("PREVIOUS_RELEASE="):
            return line.split("=", 1)[1].strip()
    raise AssertionError(f"{PREVIOUS_PIN} names no PREVIOUS_RELEASE=<commit>")


def previous_images() -> list[Path]:
    """The previous release's image archives: `tests/controlplane/images --previous`, which
    `make test`'s longwatch ring builds before its tests (tests/rings.py BEFORE): then it
    only prints where they are; while that build runs, it waits on the images' lock."""
    built = subprocess.run(
        [str(ROOT / "tests" / "controlplane" / "images"), "--previous"],
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        raise AssertionError(f"the previous release's images: {built.stderr[-3000:]}")
    out = Path(built.stdout.strip().splitlines()[-1])
    return [out / "previous-cronlock.tar", out / "previous-cronlock-sidecar.tar"]


def previous_chart(into: Path) -> Path:
    """The previous release's chart, out of `git archive` of its commit, under `into`."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", previous_commit(), "charts/cronlock"],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "charts" / "cronlock"
