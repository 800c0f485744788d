"""A fixture tearing down after a failed test knows it failed and names its evidence in the
session's summary (tests/conftest.py, tests/support/evidence.py); a passing test keeps none."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import evidence
from tests.support.paths import ROOT

CONFTEST = """
from pathlib import Path

import pytest

from tests.conftest import pytest_runtest_makereport, pytest_terminal_summary
from tests.support import evidence


@pytest.fixture
def watched(request):
    yield
    if evidence.failed(request.node):
        folder = Path("kept") / request.node.name
        folder.mkdir(parents=True)
        evidence.kept(request.config, folder)
"""

TESTS = """
def test_passes(watched):
    pass

def test_fails(watched):
    assert 1 == 2
"""


def test_a_failed_test_names_its_evidence_folder_and_a_passing_one_none(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_sample.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stdout
    assert "1 failed, 1 passed" in result.stdout
    assert "evidence of the failed tests" in result.stdout
    assert "  kept/test_fails" in result.stdout
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["test_fails"]


def test_each_test_gets_a_folder_of_its_own_named_readably() -> None:
    one = evidence.folder_for("tests/e2e/test_failures.py::test_a_killed_sidecar[19s]")
    other = evidence.folder_for("tests/e2e/test_failures.py::test_a_killed_sidecar[30s]")
    assert one != other
    assert one.parent == evidence.ROOT_DIR
    assert one.name == "tests_e2e_test_failures.py__test_a_killed_sidecar_19s"
