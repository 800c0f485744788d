"""The images as built from our Dockerfile (the archives the real node imported).

What each carries is read from its layers: the operator's keeps no pip or setuptools, the
sidecar's carries the sidecar's package and nothing of the operator's dependencies. The
sidecar image runs as the node runs it in every e2e test; here, its size and contents.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.node import RealNode
from tests.support.paths import CACHE, ROOT

ARCHIVES = Path(os.environ.get("CRONLOCK_IMAGES_DIR") or CACHE / "images" / "out")
# The Dockerfile's base; tests/controlplane/images stores a stand-in under this name.
BASE = "docker.io/library/python:3.11-slim"


def layer_paths(archive: Path) -> Iterator[tuple[str, int]]:
    """(path, size) of every file in every layer of the image in an OCI archive."""
    with tarfile.open(archive) as outer:
        (entry,) = json.loads(_read(outer, "index.json"))["manifests"]
        manifest = json.loads(_read(outer, _blob(entry["digest"])))
        for layer in manifest["layers"]:
            member = outer.extractfile(_blob(layer["digest"]))
            assert member is not None, layer
            with tarfile.open(fileobj=member, mode="r:*") as inner:
                for item in inner:
                    if item.isfile():
                        yield item.name.removeprefix("./"), item.size


def _blob(digest: str) -> str:
    return "blobs/" + digest.replace(":", "/")


def _read(outer: tarfile.TarFile, name: str) -> bytes:
    member = outer.extractfile(name)
    assert member is not None, name
    return member.read()


@pytest.fixture(scope="module")
def contents(node: RealNode) -> dict[str, dict[str, int]]:
    """Image -> its files (path -> bytes); the node fixture built the archives."""
    found = {}
    for image in ("cronlock", "cronlock-sidecar", "cronlock-sidecar-stores"):
        archive = ARCHIVES / f"{image}.tar"
        assert archive.exists(), f"{archive}: the node fixture did not build it"
        found[image] = dict(layer_paths(archive))
    return found


def site_packages(files: dict[str, int]) -> set[str]:
    """The top-level distributions and packages under any site-packages directory."""
    return {
        path.split("site-packages/", 1)[1].split("/", 1)[0]
        for path in files
        if "/site-packages/" in path
    }


def test_the_operator_image_carries_no_pip_or_setuptools(
    contents: dict[str, dict[str, int]],
) -> None:
    venv = {path: size for path, size in contents["cronlock"].items() if path.startswith("opt/")}
    packages = site_packages(venv)
    assert {"kopf", "kubernetes", "cronlock_operator", "cronlock_sidecar"} <= packages
    assert not {name for name in packages if name.startswith(("pip", "setuptools"))}, packages
    assert "opt/venv/bin/pip" not in venv
    assert not any(path.startswith("opt/build/") for path in venv), "the build venv leaked"


def test_the_sidecar_image_carries_the_sidecar_alone(
    contents: dict[str, dict[str, int]],
) -> None:
    ours = {path for path in contents["cronlock-sidecar"] if path.startswith("opt/")}
    assert "opt/sidecar/bin/cronlock-sidecar" in ours
    assert "opt/sidecar/cronlock_sidecar/cli.py" in ours
    assert all(path.startswith("opt/sidecar/") for path in ours), sorted(ours)[:20]
    assert not any("cronlock_operator" in path or "/kopf/" in path for path in ours)
    compiled = [path for path in ours if path.endswith(".pyc")]
    assert compiled, "the sidecar's .pyc were not kept: every start would compile it again"
    sizes = {image: sum(files.values()) for image, files in contents.items()}
    own = {
        image: sum(size for path, size in files.items() if path.startswith("opt/"))
        for image, files in contents.items()
    }
    print(
        f"image files, uncompressed: operator {sizes['cronlock'] / 2**20:.1f} MiB (its /opt "
        f"{own['cronlock'] / 2**20:.1f} MiB), sidecar {sizes['cronlock-sidecar'] / 2**20:.1f} "
        f"MiB (its /opt {own['cronlock-sidecar'] / 2**10:.0f} KiB)"
    )


def test_the_stores_image_is_the_sidecar_and_one_layer_of_store_clients(
    contents: dict[str, dict[str, int]],
) -> None:
    sidecar, stores = contents["cronlock-sidecar"], contents["cronlock-sidecar-stores"]
    added = {path: size for path, size in stores.items() if path not in sidecar}
    assert set(sidecar) <= set(stores)
    tops = {path.split("/")[2] for path in added if path.startswith("opt/sidecar/")}
    assert {"redis", "psycopg", "psycopg_binary"} <= tops, sorted(tops)
    assert all(path.startswith("opt/sidecar/") for path in added), sorted(added)[:20]
    assert not {name for name in tops if name.startswith(("pip", "setuptools", "kopf"))}
    assert any(path.endswith(".pyc") for path in added), "the clients' .pyc were not kept"
    print(
        f"sidecar-stores adds {sum(added.values()) / 2**20:.1f} MiB uncompressed to the "
        f"sidecar's {sum(sidecar.values()) / 2**20:.1f} MiB"
    )


def buildah() -> list[str]:
    """buildah on the storage tests/controlplane/images builds in."""
    driver = os.environ.get("CRONLOCK_BUILDAH_DRIVER", "overlay")
    work = CACHE / "images" / "buildah" / driver
    return [
        "buildah",
        "--storage-driver",
        driver,
        "--root",
        f"{work}/root",
        "--runroot",
        f"{work}/run",
    ]


def dev_build_log(log: str) -> str:
    """The part of tests/controlplane/images' log that built the node's images.

    Only that build is checked here, whatever ran before, in any order: before the release
    got a log of its own (release.log), a --release run (tests/e2e/test_release.py)
    appended its builds to this one, from a base named by tag when it builds an image
    list. The node's build ends with the sizes of its three images, the stores image last.
    """
    stores = os.environ.get(
        "CRONLOCK_SIDECAR_STORES_IMAGE", "localhost/cronlock-sidecar-stores:dev"
    )
    end = re.search(rf"^{re.escape(stores)}\s+\d.*$", log, re.MULTILINE)
    assert end, f"the image log has no dev build (no size line for {stores}):\n{log[-2000:]}"
    return log[: end.end()]


def test_the_images_were_built_from_the_base_named_by_its_digest(node: RealNode) -> None:
    """As docs/INSTALL.md tells users to pin the base (`make image BASE=...@sha256:...`)."""
    digest = subprocess.run(
        [*buildah(), "inspect", "--type", "image", "--format", "{{.FromImageDigest}}", BASE],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), digest
    log = dev_build_log((CACHE / "images" / "build.log").read_text())
    steps = re.findall(r"STEP \d+/\d+: FROM (\S+)", log)
    # Builder, operator and sidecar stages, in every target's build: all from the digest;
    # the stages built on another stage (stores-builder, sidecar-stores) name it by its ID.
    assert steps, "the image build logged no FROM step"
    images = [step for step in steps if not re.fullmatch(r"[0-9a-f]{64}", step)]
    assert set(images) == {f"{BASE}@{digest}"}, steps
    assert len(steps) - len(images) == 2, steps


def test_a_base_pinned_to_another_digest_is_refused(node: RealNode) -> None:
    """Pinned means exactly that image: another digest does not build (no registry here,
    so nothing could be pulled instead either)."""
    wrong = f"{BASE}@sha256:{'0' * 64}"
    result = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "image",
            "BUILDER=buildah",
            f"BUILDAH={' '.join(buildah())}",
            "BUILD_FLAGS=--pull=never --isolation chroot",
            f"BASE={wrong}",
            "IMAGE=localhost/cronlock:wrong-base",
            "SIDECAR_IMAGE=localhost/cronlock-sidecar:wrong-base",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    # buildah names it without the tag: docker.io/library/python@sha256:000...
    assert f"python@sha256:{'0' * 64}: image not known" in result.stderr, result.stderr[-2000:]
