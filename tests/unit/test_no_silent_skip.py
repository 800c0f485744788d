"""The session fails when any collected test did not run: skipped, xfailed, xpassed or
deselected (tests/conftest.py), so a green run means every test ran and passed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

TESTS = """
import pytest

def test_runs():
    pass

def test_other():
    pass

def test_skipped():
    pytest.skip("no node here")

@pytest.mark.xfail(reason="known bug")
def test_xfailed():
    assert False

@pytest.fixture(scope="session")
def node():
    pytest.skip("the whole ring")

def test_needs_node(node):
    pass
"""


def run(
    tmp_path: Path, *args: str, ci: str = "", order: str = ""
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_collection_modifyitems, pytest_configure\n"
    )
    (tmp_path / "test_sample.py").write_text(TESTS)
    left = ("CI", "PYTEST_ADDOPTS", "CRONLOCK_TEST_ORDER")
    env = {key: value for key, value in os.environ.items() if key not in left}
    env.update(PYTHONPATH=str(ROOT), CI=ci, CRONLOCK_TEST_ORDER=order)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_skips_and_xfails_fail_the_run_naming_each(tmp_path: Path) -> None:
    result = run(tmp_path, "test_sample.py")
    assert result.returncode == 1, result.stdout
    assert "2 passed, 2 skipped, 1 xfailed" in result.stdout
    assert "tests left out: the run fails" in result.stdout
    for line in (
        "skipped: test_sample.py::test_skipped (Skipped: no node here)",
        "skipped: test_sample.py::test_needs_node (Skipped: the whole ring)",
        "xfailed: test_sample.py::test_xfailed (known bug)",
    ):
        assert line in result.stdout, result.stdout


def test_a_run_where_everything_ran_passes(tmp_path: Path) -> None:
    result = run(tmp_path, "test_sample.py::test_runs", "test_sample.py::test_other")
    assert result.returncode == 0, result.stdout
    assert "tests left out" not in result.stdout


def test_deselection_by_hand_is_allowed_but_not_under_ci(tmp_path: Path) -> None:
    by_hand = run(tmp_path, "test_sample.py", "-k", "runs or other")
    assert by_hand.returncode == 0, by_hand.stdout
    assert "2 passed, 3 deselected" in by_hand.stdout
    in_ci = run(tmp_path, "test_sample.py", "-k", "runs or other", ci="true")
    assert in_ci.returncode == 1, in_ci.stdout
    assert "deselected: test_sample.py::test_skipped" in in_ci.stdout


def test_deselection_not_asked_for_on_the_command_line_fails(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -k runs\n")
    result = run(tmp_path, "test_sample.py")
    assert result.returncode == 1, result.stdout
    assert "deselected: test_sample.py::test_other" in result.stdout


def test_the_tests_run_in_reverse_when_asked(tmp_path: Path) -> None:
    forward = run(tmp_path, "test_sample.py::test_runs", "test_sample.py::test_other", "-v")
    backward = run(
        tmp_path,
        "test_sample.py::test_runs",
        "test_sample.py::test_other",
        "-v",
        order="reverse",
    )
    assert forward.returncode == backward.returncode == 0, forward.stdout + backward.stdout
    ran = [
        [line.split()[0] for line in result.stdout.splitlines() if " PASSED" in line]
        for result in (forward, backward)
    ]
    assert ran[0] == ["test_sample.py::test_runs", "test_sample.py::test_other"]
    assert ran[1] == ran[0][::-1]
    wrong = run(tmp_path, "test_sample.py::test_runs", order="shuffled")
    assert wrong.returncode == 4, wrong.stdout + wrong.stderr
    assert "CRONLOCK_TEST_ORDER='shuffled': expected one of collected, reverse" in wrong.stderr


@pytest.mark.parametrize(
    "module",
    [
        'import pytest\npytest.skip("no store here", allow_module_level=True)\n',
        'import pytest\npytest.importorskip("cronlock_no_such_module")\n',
    ],
    ids=["skip-allow-module-level", "importorskip"],
)
def test_a_module_that_skips_itself_fails_the_run(tmp_path: Path, module: str) -> None:
    (tmp_path / "test_whole.py").write_text(module + "\ndef test_never():\n    pass\n")
    result = run(tmp_path, "test_sample.py::test_runs", "test_whole.py")
    assert result.returncode == 1, result.stdout
    assert "1 passed, 1 skipped" in result.stdout, result.stdout
    assert "skipped: test_whole.py (the whole module: " in result.stdout, result.stdout
