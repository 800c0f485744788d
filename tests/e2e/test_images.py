"""The two images as built from our Dockerfile (the archives the real node imported).

What each carries is read from its layers: the operator's keeps no pip or setuptools, the
sidecar's carries the sidecar's package and nothing of the operator's dependencies. The
sidecar image runs as the node runs it in every e2e test; here, its size and contents.
"""

from __future__ import annotations

import json
import os
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.node import RealNode

CACHE = Path(
    os.environ.get("CRONLOCK_CACHE_DIR")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cronlock"
)
ARCHIVES = Path(os.environ.get("CRONLOCK_IMAGES_DIR") or CACHE / "images" / "out")


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
    for image in ("cronlock", "cronlock-sidecar"):
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


def manifest_annotations(archive: Path) -> dict[str, str]:
    with tarfile.open(archive) as outer:
        (entry,) = json.loads(_read(outer, "index.json"))["manifests"]
        manifest = json.loads(_read(outer, _blob(entry["digest"])))
    return manifest.get("annotations") or {}


@pytest.mark.parametrize("image", ["cronlock", "cronlock-sidecar"])
def test_each_image_records_a_base_pinned_by_digest(node: RealNode, image: str) -> None:
    """Built as docs/INSTALL.md tells users to pin the base (`make image BASE=...@sha256:`):
    the manifest names the base by that digest."""
    annotations = manifest_annotations(ARCHIVES / f"{image}.tar")
    name = annotations["org.opencontainers.image.base.name"]
    assert re.fullmatch(r"docker\.io/library/python:3\.11-slim@sha256:[0-9a-f]{64}", name), name
    assert annotations["org.opencontainers.image.base.digest"] == name.split("@", 1)[1]
