"""Blocks of the papers that tests run or compare: a fenced block follows a line
`<!-- tested: NAME -->`, so editing the block changes what the test runs. A block a user
would paste that no test can run follows `<!-- illustrative: REASON -->` instead;
tests/unit/test_doc_blocks.py fails on a block of PAPERS that has neither."""

from __future__ import annotations

import re
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

from tests.support.paths import ROOT

INSTALL_MD = ROOT / "docs" / "INSTALL.md"
# Every paper a user reads, the README and all of docs/: a block a user would paste in any
# of them is run by a test or marked illustrative with the reason.
PAPERS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
# A fence's language that says its block is read, not pasted: a program's output, a
# manifest or values file shown whole. Everything else (sh, console, sql, lua, a fence
# without a language) is pasted somewhere and needs a marker.
READ_ONLY = frozenset({"text", "yaml", "json"})
FENCE = re.compile(r"^( *)```(\S*) *$")
# One line, right above the opening fence: a comment spread over lines is not a marker
# (the docs checks outside this repository read markers line by line too).
MARKER = re.compile(r"<!-- (tested|illustrative): *(.*?) *-->")
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


@dataclass(frozen=True)
class Block:
    """A fenced block of a paper: where it starts, its fence's language, and the marker
    comment right above it (`tested`/`illustrative` and its name or reason), if any."""

    paper: Path
    line: int
    language: str
    kind: str | None
    label: str

    def __str__(self) -> str:
        where = self.paper.relative_to(ROOT) if self.paper.is_relative_to(ROOT) else self.paper
        return f"{where}:{self.line} ({self.language or 'no language'})"


def fenced_blocks(paper: Path) -> list[Block]:
    """Every fenced block of `paper`, with the `<!-- ... -->` marker on the line above its
    opening fence (one line: a marker spread over lines counts as none)."""
    lines = paper.read_text().splitlines()
    blocks = []
    number = 0
    while number < len(lines):
        opening = FENCE.match(lines[number])
        if not opening:
            number += 1
            continue
        kind, label = None, ""
        found = MARKER.fullmatch(lines[number - 1].strip()) if number else None
        if found:
            kind, label = found.group(1), " ".join(found.group(2).split())
        blocks.append(Block(paper, number + 1, opening.group(2), kind, label))
        closing = number + 1
        while closing < len(lines) and lines[closing].strip() != "```":
            closing += 1
        assert closing < len(lines), f"{paper}:{number + 1}: a fence never closed"
        number = closing + 1
    return blocks


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
