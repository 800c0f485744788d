"""Docs that run: every block a user would paste from README.md and docs/*.md
(tests.support.papers.PAPERS) is run by a test (`<!-- tested: NAME
-->` above it, and a test reads NAME through `marked_block`) or says why none can
(`<!-- illustrative: REASON -->`). A new block without either, or a marker no test reads,
fails here; a marked block that changes is what its test runs next (issue 54, item 1)."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from tests.support.papers import PAPERS, READ_ONLY, Block, fenced_blocks
from tests.support.paths import ROOT

TESTS = ROOT / "tests"
# The functions that read a marked block by its name: `marked_block(paper, NAME)` and the
# stores tests' `documented(NAME)`. A test that reads one through another wrapper is not
# seen here; test_every_reader_of_marked_blocks_is_known names such a wrapper.
READERS = {"marked_block": 1, "documented": 0}


def callee(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


def names_read_by_tests(root: Path = TESTS) -> dict[str, str]:
    """Each marker name a test passes as a literal to a reader; name -> file."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or callee(node) not in READERS:
                continue
            position = READERS[callee(node) or ""]
            if len(node.args) > position:
                argument = node.args[position]
                if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                    found[argument.value] = str(path.relative_to(ROOT))
    return found


def unmarked(blocks: list[Block]) -> list[str]:
    return [
        str(block)
        for block in blocks
        if block.language not in READ_ONLY and (block.kind is None or not block.label)
    ]


def all_blocks() -> list[Block]:
    return [block for paper in PAPERS for block in fenced_blocks(paper)]


def test_every_block_a_user_would_paste_is_tested_or_illustrative() -> None:
    missing = unmarked(all_blocks())
    assert missing == [], (
        "run each block in a test (`<!-- tested: NAME -->` above it, and the test reads it "
        "with tests.support.papers.marked_block), or put `<!-- illustrative: REASON -->` "
        "above it saying why no test can; an output or a file shown whole takes the fence "
        f"language `text`, `yaml` or `json`: {missing}"
    )


def test_every_tested_marker_names_a_block_a_test_reads() -> None:
    read = names_read_by_tests()
    tested = [block for block in all_blocks() if block.kind == "tested"]
    assert tested, "the scan found no tested block"
    nobody = [f"{block}: {block.label}" for block in tested if block.label not in read]
    assert nobody == [], f"markers no test reads (a defect: the block runs nowhere): {nobody}"
    twice = [name for name, count in Counter(b.label for b in tested).items() if count > 1]
    assert twice == [], f"one name, two blocks: {twice}"


def test_every_reader_of_marked_blocks_is_known() -> None:
    """A wrapper that passes a name on to a reader must be a reader itself, so that the
    names its callers pass are seen by the test above."""
    unknown = []
    for path in sorted(TESTS.rglob("*.py")):
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef) or function.name in READERS:
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Call) and callee(node) in READERS:
                    argument = node.args[READERS[callee(node) or ""]]
                    if not isinstance(argument, ast.Constant):
                        unknown.append(f"{path.relative_to(ROOT)}: {function.name}")
    assert unknown == [], f"add these to READERS: {unknown}"


def test_the_scan_tells_marked_blocks_from_unmarked(tmp_path: Path) -> None:
    paper = tmp_path / "PAPER.md"
    paper.write_text(
        "Run:\n\n```sh\nmake demo\n```\n\n"
        "<!-- tested: demo -->\n```sh\nmake demo\n```\n\n"
        "1. In a list:\n\n   <!-- illustrative: it needs a cloud provider's load balancer -->\n"
        "   ```console\n   $ kubectl get svc\n   ```\n\n"
        "```text\nsome output\n```\n\n```\nACL SETUSER x\n```\n\n"
        "<!-- tested: -->\n```sh\ntrue\n```\n\n"
        "<!-- illustrative: a reason spread\nover two lines -->\n```sh\nfalse\n```\n"
    )
    blocks = fenced_blocks(paper)
    assert [(b.line, b.language, b.kind, b.label) for b in blocks] == [
        (3, "sh", None, ""),
        (8, "sh", "tested", "demo"),
        (15, "console", "illustrative", "it needs a cloud provider's load balancer"),
        (19, "text", None, ""),
        (23, "", None, ""),
        (28, "sh", "tested", ""),
        (34, "sh", None, ""),
    ]
    # Unmarked: the plain sh block, the one without a language, the marker without a name,
    # and the one whose marker spans two lines.
    assert unmarked(blocks) == [str(b) for b in blocks if b.line in (3, 23, 28, 34)]


def test_the_reader_scan_finds_the_names_tests_pass() -> None:
    read = names_read_by_tests()
    assert read["uninstall"] == "tests/integration/test_uninstall_recipe.py"
    assert read["redis-acl"].startswith("tests/integration/")
    assert "source-install" in read  # tests/support/papers.py's own readers
