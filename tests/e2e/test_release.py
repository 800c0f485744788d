"""A release, published and installed the way a user installs it: `make release`'s script
(hack/release) pushes the images as image indexes and the chart as an OCI artifact to a
real registry (`crane registry serve`, on the node's network), and `helm install
oci://…/charts/cronlock --version X` with no image setting at all brings up the operator
and guards a run, the node's containerd pulling both images from the registry by digest.
`helm test` passes. The release is for this host's platform, or the platforms
CRONLOCK_RELEASE_PLATFORMS names (linux/amd64,linux/arm64 as `make release` builds them,
the other architecture under emulation; docs/RELEASING.md)."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from tests.support import runs
from tests.support.controlplane import ControlPlane
from tests.support.helm import RESTRICTED, TEST_WAIT, helm
from tests.support.kube import run_tool
from tests.support.node import RealNode
from tests.support.papers import marked_block, run_shell
from tests.support.paths import CACHE, ROOT
from tests.support.tools import gotool

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
HOST_ARCH = subprocess.run(
    ["dpkg", "--print-architecture"], check=True, capture_output=True, text=True
).stdout.strip()
# What tests/controlplane/images --release publishes: the host's platform unless told more.
PLATFORMS = set((os.environ.get("CRONLOCK_RELEASE_PLATFORMS") or f"linux/{HOST_ARCH}").split(","))
# Where tests/controlplane/images --release has hack/release write its files.
RELEASE_DIST = CACHE / "images" / "dist"
# ELF e_machine of each architecture's programs.
MACHINES = {"amd64": 0x3E, "arm64": 0xB7}


def crane(controlplane: ControlPlane, *args: str) -> str:
    result = subprocess.run(
        [gotool("crane"), "--insecure", *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.stdout


@pytest.fixture(scope="module")
def published(controlplane: ControlPlane, node: RealNode) -> dict[str, Any]:
    """hack/release run once against the node's registry; its record."""
    result = subprocess.run(
        [str(ROOT / "tests" / "controlplane" / "images"), "--release", f"{node.registry}/cronlock"],
        env=controlplane.env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    record: dict[str, Any] = json.loads(result.stdout)
    return record


@pytest.mark.timeout(600)
def test_the_registry_holds_the_release_as_image_indexes_and_a_chart(
    controlplane: ControlPlane, node: RealNode, published: dict[str, Any]
) -> None:
    registry = f"{node.registry}/cronlock"
    assert published["version"] == VERSION
    for name, key in (
        ("cronlock", "operator"),
        ("cronlock-sidecar", "sidecar"),
        ("cronlock-sidecar-stores", "sidecar-stores"),
    ):
        ref = published["images"][key]
        repository, digest = ref.split("@")
        assert repository == f"{registry}/{name}"
        # The tag and the recorded digest name the same image index.
        assert crane(controlplane, "digest", f"{repository}:{VERSION}").strip() == digest
        index = json.loads(crane(controlplane, "manifest", ref))
        assert index["mediaType"] in (
            "application/vnd.oci.image.index.v1+json",
            "application/vnd.docker.distribution.manifest.list.v2+json",
        )
        platforms = {
            f"{entry['platform']['os']}/{entry['platform']['architecture']}"
            for entry in index["manifests"]
        }
        assert platforms == set(published["platforms"]) == PLATFORMS
        # Each platform's image says what it is (the Dockerfile's labels, the release's
        # version and commit), so it is never the same image as a dev build of it.
        for platform in platforms:
            config = json.loads(crane(controlplane, "config", "--platform", platform, ref))
            labels = config["config"]["Labels"]
            assert labels["org.opencontainers.image.version"] == VERSION
            assert labels["org.opencontainers.image.revision"] == published["revision"]
            assert labels["org.opencontainers.image.title"] == name
    chart = published["chart"]
    assert chart.startswith(f"oci://{registry}/charts/cronlock:{VERSION}@sha256:")
    # What `helm show values` of the pushed chart gives: the images by digest.
    shown = helm(
        controlplane,
        "show",
        "values",
        f"oci://{registry}/charts/cronlock",
        "--version",
        VERSION,
        "--plain-http",
    ).stdout
    operator_repository, operator_digest = published["images"]["operator"].split("@")
    assert f"repository: {operator_repository}\n" in shown
    assert f'digest: "{operator_digest}"' in shown
    stores_repository, stores_digest = published["images"]["sidecar-stores"].split("@")
    assert f"repository: {stores_repository}\n" in shown
    assert f'digest: "{stores_digest}"' in shown
    # Its papers say the same: Artifact Hub's list names the three images by digest, and
    # the README installs from a registry, not from a clone.
    pulled = ("--version", VERSION, "--plain-http")
    about = yaml.safe_load(
        helm(controlplane, "show", "chart", f"oci://{registry}/charts/cronlock", *pulled).stdout
    )
    listed = yaml.safe_load(about["annotations"]["artifacthub.io/images"])
    assert [image["image"] for image in listed] == [
        published["images"][key] for key in ("operator", "sidecar", "sidecar-stores")
    ]
    readme = helm(controlplane, "show", "readme", f"oci://{registry}/charts/cronlock", *pulled)
    assert f"oci://ghcr.io/cronlock/charts/cronlock --version {VERSION}" in readme.stdout
    assert "not published" not in readme.stdout
    # Made for the release (hack/release runs charts/readme on the copy it packages): its
    # values table gives the defaults the package has, the images by digest.
    assert f'`"{operator_digest}"`' in readme.stdout, readme.stdout
    assert f'`"{stores_digest}"`' in readme.stdout
    # install.yaml for the GitHub release: the package rendered, every image by digest, so
    # Kustomize's images: may rename them (tests/integration/test_kustomize.py).
    install = (RELEASE_DIST / "install.yaml").read_text()
    assert f"chart: cronlock-{VERSION}" in install
    for ref in published["images"].values():
        assert f'"{ref}"' in install, ref


@pytest.mark.timeout(900)
def test_helm_install_from_the_registry_pulls_both_images_by_digest_and_guards_a_run(
    controlplane: ControlPlane,
    api: kubernetes.client.ApiClient,
    namespace: str,
    node: RealNode,
    published: dict[str, Any],
) -> None:
    controlplane.kubectl("label", "namespace", namespace, "--overwrite", *RESTRICTED)
    name = f"cl-{secrets.token_hex(3)}"
    # The README's install of a release (`<!-- tested: readme-release -->`), from this
    # registry standing for ghcr.io/cronlock; only what scopes it to this test is added.
    lines = readme_release(name, namespace, node.registry).splitlines()
    install, check = "\n".join(lines[:-1]), lines[-1]
    assert install.startswith(f"helm install {name} "), install
    assert check.startswith(f"helm test {name} "), check
    run_shell(install, controlplane.env, ROOT, timeout=300)
    try:
        core = kubernetes.client.CoreV1Api(api)
        (pod,) = core.list_namespaced_pod(
            namespace, label_selector=f"app.kubernetes.io/instance={name}"
        ).items
        operator_ref = published["images"]["operator"]
        assert pod.spec.containers[0].image == operator_ref
        assert pod.status.container_statuses[0].image_id.endswith(operator_ref.split("@")[1])

        # The operator injects the sidecar by the digest the chart carries; a run pulls it.
        guard_and_run(api, namespace, published["images"]["sidecar"])

        passed = run_shell(check, controlplane.env, ROOT, timeout=300)
        assert "Phase:          Succeeded" in passed
        assert "/metrics: cronlock's metrics" in passed  # --logs: what it scraped
    finally:
        helm(controlplane, "uninstall", name, "-n", namespace, "--wait", check=False)


def readme_release(name: str, namespace: str, registry: str) -> str:
    """README.md's `helm install` and `helm test` of a published release, for the release
    `name` in `namespace` from `registry` (plain HTTP), watching `namespace` alone."""
    block = marked_block(ROOT / "README.md", "readme-release")
    scope = f"watchNamespaces={{{namespace}}},tests.wait={TEST_WAIT}"
    for old, new in (
        ("oci://ghcr.io/cronlock/", f"oci://{registry}/cronlock/"),
        (f"--version {VERSION} ", f"--version {VERSION} --plain-http "),
        ("helm install cronlock ", f"helm install {name} "),
        ("helm test cronlock ", f"helm test {name} "),
        ("cronlock-system", namespace),
        ("--wait\n", f"--wait --timeout 240s --set {shlex.quote(scope)}\n"),
    ):
        assert old in block, f"the README's block no longer names {old!r}:\n{block}"
        block = block.replace(old, new)
    return block


def guard_and_run(api: kubernetes.client.ApiClient, namespace: str, sidecar_ref: str) -> None:
    """A run guarded by the installed operator, which injects `sidecar_ref` (by digest)."""
    runs.guard_and_run(api, namespace, sidecar_ref, sidecar_ref.split("@")[1])


@pytest.mark.timeout(900)
def test_install_yaml_moved_to_a_mirror_by_kustomize_pulls_all_three_from_it_and_guards_a_run(
    controlplane: ControlPlane,
    api: kubernetes.client.ApiClient,
    namespace: str,
    node: RealNode,
    published: dict[str, Any],
    tmp_path: Path,
) -> None:
    """Issue 44 item 5 on the real node: the release's install.yaml (hack/release renders it
    from the package) in a kustomization whose `images:` moves all three images to another
    repository of the registry, copied there by digest as a mirror is. The operator's pod
    pulls its image and its two init containers' from the mirror; the operator, reading
    them there, injects the mirror's sidecar; the install's own policy admits it (pinned by
    digest); a run pulls it from the mirror and completes."""
    controlplane.kubectl("label", "namespace", namespace, "--overwrite", *RESTRICTED)
    space = f"cl-kz-{secrets.token_hex(3)}"
    mirror = f"{node.registry}/mirror"
    moved: dict[str, str] = {}
    for key, ref in published["images"].items():
        repository, digest = ref.split("@")
        name = repository.rsplit("/", 1)[1]
        crane(controlplane, "copy", ref, f"{mirror}/{name}:{VERSION}")
        assert crane(controlplane, "digest", f"{mirror}/{name}:{VERSION}").strip() == digest
        moved[key] = f"{mirror}/{name}@{digest}"
    (tmp_path / "install.yaml").write_text(
        (RELEASE_DIST / "install.yaml").read_text().replace("cronlock-system", space)
    )
    env = [{"name": "CRONLOCK_NAMESPACES", "value": namespace}]
    only_here = {  # what scopes it to this test's namespace, as --set watchNamespaces does
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "cronlock", "namespace": space},
        "spec": {"template": {"spec": {"containers": [{"name": "operator", "env": env}]}}},
    }
    kustomization = {
        "resources": ["install.yaml"],
        "images": [
            {"name": ref.split("@")[0], "newName": moved[key].split("@")[0]}
            for key, ref in published["images"].items()
        ],
        "patches": [{"patch": yaml.safe_dump(only_here)}],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    built = tmp_path / "built.yaml"
    built.write_text(controlplane.kubectl("kustomize", str(tmp_path)))
    try:
        controlplane.kubectl("apply", "-f", str(built))
        rollout = ("rollout", "status", "deployment/cronlock", "-n", space, "--timeout=240s")
        run_tool(controlplane.env, "kubectl", *rollout, timeout=300)
        core = kubernetes.client.CoreV1Api(api)
        (pod,) = core.list_namespaced_pod(
            space, label_selector="app.kubernetes.io/instance=cronlock"
        ).items
        images = {c.name: c.image for c in pod.spec.init_containers + pod.spec.containers}
        assert images == {
            "sidecar-image": moved["sidecar"],
            "sidecar-stores-image": moved["sidecar-stores"],
            "operator": moved["operator"],
        }
        statuses = pod.status.init_container_statuses + pod.status.container_statuses
        assert all(s.image_id.endswith(images[s.name].split("@")[1]) for s in statuses)
        guard_and_run(api, namespace, moved["sidecar"])
    finally:
        delete = ("delete", "-f", str(built), "--ignore-not-found", "--wait", "--timeout=180s")
        run_tool(controlplane.env, "kubectl", *delete, timeout=240, check=False)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("name", "key", "command"),
    [
        ("cronlock-sidecar", "sidecar", "/opt/sidecar/bin/cronlock-sidecar"),
        ("cronlock", "operator", "/opt/venv/bin/cronlock-operator"),
    ],
)
def test_each_platforms_images_run_their_commands(
    controlplane: ControlPlane,
    published: dict[str, Any],
    tmp_path: Path,
    name: str,
    key: str,
    command: str,
) -> None:
    """Each platform of the release, pulled from the registry by the index's digest: its
    programs are that architecture's ELF files, and its command starts (another
    architecture's under qemu, as on such a node)."""
    for platform in sorted(published["platforms"]):
        root = tmp_path / name / platform.replace("/", "-")
        root.mkdir(parents=True)
        archive = str(root / "fs.tar")
        crane(controlplane, "--platform", platform, "export", published["images"][key], archive)
        subprocess.run(["tar", "-xf", "fs.tar", "--exclude=dev/*"], cwd=root, check=True)
        python = (root / "usr" / "bin" / "python3.11").read_bytes()[:20]
        assert python[:4] == b"\x7fELF"
        machine = int.from_bytes(python[18:20], "little")
        assert machine == MACHINES[platform.split("/")[1]], (platform, hex(machine))
        started = subprocess.run(
            ["chroot", "--userspec=65532:65532", str(root), command, "--help"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert started.returncode == 0, (platform, started.stderr[-2000:])
        assert started.stdout.startswith("usage: "), platform
