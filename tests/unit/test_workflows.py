"""The release workflow passes actionlint (with shellcheck on its `run:` steps), and
actionlint does fail a workflow with a mistake of the kinds it checks."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.tools import gotool

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"


@pytest.fixture(scope="module")
def actionlint() -> str:
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is missing: tests/controlplane/host-packages installs it")
    return gotool("actionlint")


def lint(actionlint: str, *files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [actionlint, "-no-color", "-oneline", *map(str, files)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )


def test_the_workflows_pass_actionlint(actionlint: str) -> None:
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert [f.name for f in files] == ["release.yml"]
    result = lint(actionlint, *files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_fails_an_unknown_permission_and_an_unquoted_expansion(
    actionlint: str, tmp_path: Path
) -> None:
    text = (WORKFLOWS / "release.yml").read_text()
    broken = text.replace("packages: write", "pakages: write", 1).replace(
        'echo "VERSION=$version" >> "$GITHUB_ENV"', "echo VERSION=$version >> $GITHUB_ENV", 1
    )
    assert broken != text
    workflow = tmp_path / ".github" / "workflows" / "release.yml"
    workflow.parent.mkdir(parents=True)
    workflow.write_text(broken)
    result = lint(actionlint, workflow)
    assert result.returncode == 1
    assert 'unknown permission scope "pakages"' in result.stdout
    assert "SC2086" in result.stdout  # shellcheck, through actionlint
