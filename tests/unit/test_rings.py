"""`make test` runs the rings side by side (tests/rings.py): together they are exactly
pyproject's testpaths, every test file lies in one, and a failing ring fails the run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import rings
from tests.support.paths import ROOT


def test_the_rings_are_exactly_the_testpaths_and_hold_every_test_file() -> None:
    paths = rings.configured_testpaths()
    rings.check_rings(rings.RINGS, paths)
    outside = [
        str(found.relative_to(ROOT))
        for found in (ROOT / "tests").rglob("test_*.py")
        if not any(found.is_relative_to(ROOT / path) for path in paths)
    ]
    assert outside == [], "test files no ring runs; add their folder to testpaths and RINGS"
    # The e2e ring starts the node, which owns host paths: it runs alone in its process,
    # and at once (what it needs is built before the rings start).
    assert "tests/e2e" in paths
    assert ("tests/e2e",) in rings.RINGS.values()
    assert set(rings.BEFORE) <= set(rings.RINGS)
    assert "e2e" not in rings.BEFORE


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"a": ("tests/unit",)}, "tests/e2e is a testpath in no ring"),
        ({"a": ("tests/unit", "tests/e2e"), "b": ("tests/e2e",)}, "tests/e2e is in more than"),
        ({"a": ("tests/unit", "tests/e2e", "tests/more")}, "tests/more is in a ring but not"),
    ],
)
def test_a_ring_layout_that_loses_or_repeats_tests_is_refused(
    given: dict[str, tuple[str, ...]], said: str
) -> None:
    with pytest.raises(SystemExit, match=said):
        rings.check_rings(given, ["tests/unit", "tests/e2e"])


def run_rings(
    project: Path, rings_: dict[str, tuple[str, ...]], before: dict[str, tuple[str, ...]]
) -> subprocess.CompletedProcess[str]:
    """`rings.run` on a small project, in its own process as `make test` runs it."""
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from tests import rings\n"
        f"sys.exit(rings.run(['-p', 'no:cacheprovider'], {rings_!r}, Path({str(project)!r}),"
        f" {before!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_the_rings_run_at_once_and_one_failing_fails_the_run(tmp_path: Path) -> None:
    project = tmp_path / "project"
    for name, body in (
        ("slow", "import time\n\ndef test_slow():\n    time.sleep(2)\n"),
        ("fast", "def test_ok():\n    pass\n\ndef test_broken():\n    assert 1 == 2\n"),
    ):
        (project / name).mkdir(parents=True)
        (project / name / f"test_{name}.py").write_text(body)
    (project / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\ntestpaths = ["slow", "fast"]\n'
    )
    done = run_rings(
        project,
        {"slow": ("slow",), "fast": ("fast",)},
        {"fast": ("echo built for fast > built", "cat built")},
    )
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    # Both logs are printed whole, the fast ring's first: it ended first.
    assert out.index("ring fast (fast): exit 1") < out.index("ring slow (slow): exit 0"), out
    assert "FAILED fast/test_fast.py::test_broken" in out
    assert "1 failed, 1 passed" in out
    assert "fast               exit 1" in out
    assert "slow               exit 0" in out
    assert (project / ".testenv" / "rings" / "slow.log").read_text().count("test_slow.py .") == 1
    # The fast ring's steps ran first, in its process and log, before its pytest.
    fast_log = (project / ".testenv" / "rings" / "fast.log").read_text()
    assert fast_log.index("built for fast") < fast_log.index("test session starts")


def test_a_failing_step_before_a_ring_fails_it_and_its_tests_never_start(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "only").mkdir(parents=True)
    (project / "only" / "test_only.py").write_text("def test_ok():\n    pass\n")
    (project / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["only"]\n')
    done = run_rings(project, {"only": ("only",)}, {"only": ("echo building; exit 7",)})
    assert done.returncode == 7, done.stdout + done.stderr
    log = (project / ".testenv" / "rings" / "only.log").read_text()
    assert "building" in log
    assert "test session starts" not in log


def test_steps_for_a_ring_that_does_not_exist_are_refused() -> None:
    with pytest.raises(SystemExit, match="steps before nowhere, which is no ring"):
        rings.run(
            [],
            {"a": tuple(rings.configured_testpaths())},
            before={"nowhere": ("true",)},
        )
