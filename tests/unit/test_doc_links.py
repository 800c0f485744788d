"""The papers' references resolve: relative links (file and anchor), repository paths
named in prose, and sections cited by name (`docs/X.md, "Heading"`). A file moved or a
heading renamed fails here instead of leaving a reader at a dead end (the 12-05 ecosystem
review found `sidecar/src/cronlock_sidecar/stopping.py` named after it had moved to `pod/`,
and a README section cited by a name it no longer had)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import ROOT

# Named in prose but not in this repository, each for a reason the text gives.
ELSEWHERE = {
    "shared/DESIGN.md",  # the first design, "kept outside the repository"
    "build/pause/linux/pause.c",  # in the Kubernetes Go module the node is built from
}
# What `hack/release` writes (docs/RELEASING.md lists its outputs).
BUILT = "dist/"

PATH = re.compile(
    r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|md|yaml|yml|tpl|json|txt|toml|lock|in|sh|go|c|cfg|ini))`"
)
LINK = re.compile(r"\]\(([^)\s]+)\)")
CITED = re.compile(r'(README|(?:[\w.-]+/)*[A-Z][\w-]*\.md),\s+"([^"]+)"')
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def tracked() -> set[str]:
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True
    )
    return set(listed.stdout.split())


FILES = tracked()
PAPERS = sorted(path for path in FILES if path.endswith(".md"))


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def headings(path: Path) -> list[str]:
    """A paper's headings as written, outside fenced blocks."""
    return HEADING.findall(FENCE.sub("", path.read_text()))


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for a paper's headings: lower case, punctuation but `-` and `_`
    dropped, spaces to `-`."""
    return {
        re.sub(r"[^\w\- ]", "", re.sub(r"[`*]", "", heading).lower()).replace(" ", "-")
        for heading in headings(path)
    }


def resolve(paper: str, path: str) -> str | None:
    """The tracked file (or directory) `path` names from `paper`, or None."""
    beside = (ROOT / paper).parent / path
    for candidate in (ROOT / path, beside):
        try:
            normal = str(candidate.resolve().relative_to(ROOT.resolve()))
        except ValueError:  # outside the repository
            continue
        if normal in FILES or any(name.startswith(normal + "/") for name in FILES):
            return normal
    return None


def named_paths(paper: str, text: str) -> list[str]:
    """Repository paths named in backticks that no tracked file answers to: not at the
    root, not beside the paper, and no file's path ending in them (a module named from its
    package, `runtime/leader.py`)."""
    stale = []
    for match in PATH.finditer(text):
        path = match.group(1)
        if path in ELSEWHERE or path.startswith(BUILT) or resolve(paper, path):
            continue
        if any(name.endswith("/" + path) for name in FILES):
            continue
        stale.append(f"{paper}:{line_of(text, match.start())}: {path}")
    return stale


def broken_links(paper: str, text: str) -> list[str]:
    text = FENCE.sub(lambda block: "\n" * block.group().count("\n"), text)
    broken = []
    for match in LINK.finditer(text):
        target = match.group(1)
        if re.match(r"[a-z]+:", target):
            continue
        path, _, fragment = target.partition("#")
        where = resolve(paper, path) if path else paper
        at = f"{paper}:{line_of(text, match.start())}: {target}"
        if where is None:
            broken.append(f"{at} (no such file)")
        elif fragment and where.endswith(".md") and fragment not in anchors(ROOT / where):
            broken.append(f"{at} (no such heading)")
    return broken


def dangling_citations(paper: str, text: str) -> list[str]:
    dangling = []
    for match in CITED.finditer(text):
        name, section = match.group(1), " ".join(match.group(2).split())
        target = "README.md" if name == "README" else resolve(paper, name)
        at = f"{paper}:{line_of(text, match.start())}: {name}"
        if target is None:
            dangling.append(f"{at} (no such file)")
            continue
        titles = {" ".join(title.replace("`", "").split()) for title in headings(ROOT / target)}
        # Cited by its start: "A second node" for "A second node: the fleet".
        cited = section.replace("`", "")
        if not any(re.match(rf"{re.escape(cited)}(?:$|[ :,(])", title) for title in titles):
            dangling.append(f"{at}, {section!r}")
    return dangling


@pytest.mark.parametrize("paper", PAPERS)
def test_every_reference_in_a_paper_resolves(paper: str) -> None:
    text = (ROOT / paper).read_text()
    problems = named_paths(paper, text) + broken_links(paper, text)
    problems += dangling_citations(paper, text)
    assert not problems, "\n".join(problems)


def test_the_checks_find_what_the_review_found() -> None:
    """Each check on the references the 12-05 review found stale (as they were written),
    and on a missing file and heading: none of them passes vacuously."""
    paper = "docs/PAPER.md"
    text = (
        "Written in `sidecar/src/cronlock_sidecar/stopping.py`.\n"
        'Ticks are `Missed` Warnings (README, "Missed and failing runs").\n'
        "See [the opt-in](USAGE.md#opt-a-whole-namespace-in) and [gone](GONE.md).\n"
        "And [its anchor](USAGE.md#no-such-section), `docs/USAGE.md`.\n"
    )
    assert named_paths(paper, text) == [f"{paper}:1: sidecar/src/cronlock_sidecar/stopping.py"]
    assert dangling_citations(paper, text) == [f"{paper}:2: README, 'Missed and failing runs'"]
    assert broken_links(paper, text) == [
        f"{paper}:3: GONE.md (no such file)",
        f"{paper}:4: USAGE.md#no-such-section (no such heading)",
    ]
