"""docs/DESIGN.md's layer diagram matches `ls`: every room of the operator and the sidecar (a
top-level module or package) is drawn, nothing drawn is gone, and each package drawn
module by module names each of its modules in its own row."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.paths import ROOT

DESIGN = ROOT / "docs" / "DESIGN.md"
PACKAGES = {
    "operator": ROOT / "operator" / "src" / "cronlock_operator",
    "sidecar": ROOT / "sidecar" / "src" / "cronlock_sidecar",
}
# Packages drawn by the command they serve, not module by module.
BY_COMMAND = {"lint", "status", "freeze"}
ROW = re.compile(r"^\s*│ (\S+)")
CONTINUED = re.compile(r"^\s*│ {2,}")


def drawings(text: str) -> dict[str, list[str]]:
    """The diagram's lines of each package's box, by "operator"/"sidecar"."""
    block = text.split("```text\n", 1)[1].split("```", 1)[0]
    operator, sidecar = block.split("sidecar/src/cronlock_sidecar/", 1)
    return {
        "operator": operator.splitlines()[1:],
        "sidecar": sidecar.splitlines()[1:],
    }


def rooms(package: Path) -> set[str]:
    """`name.py` for each top-level module, `name/` for each package."""
    found = set()
    for path in package.iterdir():
        if path.name.startswith("__"):
            continue
        if path.is_dir() and (path / "__init__.py").exists():
            found.add(f"{path.name}/")
        elif path.suffix == ".py":
            found.add(path.name)
    return found


def drawn_rooms(lines: list[str]) -> set[str]:
    text = "\n".join(lines)
    return set(re.findall(r"\b[a-z_0-9]+\.py\b", text)) | set(
        re.findall(r"(?<![\w/.])[a-z_0-9]+/(?!\w)", text)
    )


def row(lines: list[str], package: str) -> str:
    """The text of a package's row: its first line and the indented lines after it."""
    taken: list[str] = []
    for line in lines:
        if taken and not CONTINUED.match(line):
            break
        match = ROW.match(line)
        if taken or (match and match.group(1) == f"{package}/"):
            taken.append(line)
    return "\n".join(taken)


@pytest.mark.parametrize("program", sorted(PACKAGES))
def test_every_room_is_drawn_and_nothing_drawn_is_gone(program: str) -> None:
    drawn = drawn_rooms(drawings(DESIGN.read_text())[program])
    there = rooms(PACKAGES[program])
    assert sorted(there - drawn) == [], f"in {PACKAGES[program]} but not in DESIGN.md"
    assert sorted(drawn - there) == [], f"in DESIGN.md but not in {PACKAGES[program]}"


@pytest.mark.parametrize("program", sorted(PACKAGES))
def test_each_package_row_names_its_modules(program: str) -> None:
    lines = drawings(DESIGN.read_text())[program]
    missing = []
    for package in sorted(PACKAGES[program].iterdir()):
        if not (package / "__init__.py").exists() or package.name in BY_COMMAND:
            continue
        text = row(lines, package.name)
        assert text, f"{package.name}/ has no row"
        missing += [
            f"{package.name}/{module.name}"
            for module in sorted(package.glob("*.py"))
            if not module.name.startswith("__") and not re.search(rf"\b{module.stem}\b", text)
        ]
    assert missing == [], "modules DESIGN.md's layer diagram does not name"


def test_a_room_left_out_of_the_diagram_is_found() -> None:
    lines = drawings(DESIGN.read_text())["operator"]
    without = [line.replace("storeaccess.py", "storeaccess") for line in lines]
    assert "storeaccess.py" in drawn_rooms(lines)
    assert "storeaccess.py" not in drawn_rooms(without)
    assert "holders" in row(lines, "reconcile")
    assert row(lines, "reconcile") != row(lines, "kube")


def where_a_line_belongs(text: str) -> str:
    """DESIGN.md's paragraph that says where a new line of code goes."""
    start = text.index("Where a line of code belongs:")
    return text[start : text.index("\n\n", start)]


@pytest.mark.parametrize("program", sorted(PACKAGES))
def test_where_a_line_belongs_names_every_room(program: str) -> None:
    """Issue 57: the paragraph names each room (`cronjob/`, `entry.py`...) of both
    programs, so a reader knows where a new line goes; `__init__.py`s aside."""
    paragraph = where_a_line_belongs(DESIGN.read_text())
    missing = sorted(room for room in rooms(PACKAGES[program]) if f"`{room}" not in paragraph)
    assert missing == []
