"""Blocks of the papers that tests run or compare: a fenced block follows a line
`<!-- tested: NAME -->`, so editing the block changes what the test runs."""

from __future__ import annotations

from pathlib import Path


def marked_block(paper: Path, name: str) -> str:
    """The fenced block after `<!-- tested: NAME -->` in `paper`, without its fences."""
    marker = f"<!-- tested: {name} -->\n"
    text = paper.read_text()
    assert text.count(marker) == 1, f"{paper} has {text.count(marker)} blocks marked {name!r}"
    after = text.split(marker, 1)[1]
    assert after.startswith("```"), f"{paper}: no fenced block right after {marker.strip()}"
    return after.split("```", 2)[1].split("\n", 1)[1].rstrip("\n")
