"""Blocks of the papers that tests run or compare: a fenced block follows a line
`<!-- tested: NAME -->`, so editing the block changes what the test runs."""

from __future__ import annotations

import re
import subprocess
import textwrap
from pathlib import Path

from tests.support.paths import ROOT

INSTALL_MD = ROOT / "docs" / "INSTALL.md"
# The chart value that names the image each of `make image`'s variables builds.
IMAGE_VALUES = {
    "IMAGE": "image",
    "SIDECAR_IMAGE": "sidecarImage",
    "SIDECAR_STORES_IMAGE": "sidecarStoresImage",
}


def marked_block(paper: Path, name: str) -> str:
    """The fenced block after `<!-- tested: NAME -->` in `paper`, without its fences."""
    marker = f"<!-- tested: {name} -->\n"
    text = paper.read_text()
    assert text.count(marker) == 1, f"{paper} has {text.count(marker)} blocks marked {name!r}"
    # A block inside a list item is indented as the item is: read it unindented.
    after = text.split(marker, 1)[1].lstrip(" ")
    assert after.startswith("```"), f"{paper}: no fenced block right after {marker.strip()}"
    return textwrap.dedent(after.split("```", 2)[1].split("\n", 1)[1].rstrip(" \n"))


def run_shell(block: str, env: dict[str, str], cwd: Path, timeout: float) -> str:
    """A paper's shell block run by bash as a user pastes it, stopping at the first
    command that fails; its stdout. Fails naming the block and both outputs."""
    result = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", block],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"{block}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


def source_install(space: str, watched: str) -> str:
    """docs/INSTALL.md's `helm install` from a clone, into `space` instead of
    cronlock-system, with only what scopes it to a test added: the namespace it watches."""
    block = marked_block(INSTALL_MD, "source-install")
    assert block.startswith("helm install cronlock charts/cronlock -n cronlock-system "), block
    return block.replace("cronlock-system", space) + f" \\\n  --set 'watchNamespaces={{{watched}}}'"


def built_images() -> dict[str, str]:
    """The images docs/INSTALL.md's `make image` builds, by make variable."""
    block = marked_block(INSTALL_MD, "build-images")
    assert block.startswith("make image "), block
    return dict(re.findall(r"\b([A-Z_]+)=(\S+)", block))
