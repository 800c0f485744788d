"""`kubectl cronlock <TAB>` as a user gets it: kubectl's own completion (`kubectl completion
fish`, run by fish) asks kubectl, which runs `kubectl_complete-cronlock` from PATH (kubectl
1.26 and later) and reads its answer; the pip package installs that executable beside
`kubectl-cronlock`. Without it kubectl completes nothing of the plugin's."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.controlplane import ControlPlane
from tests.support.paths import ROOT

pytestmark = pytest.mark.timeout(120)
# The console scripts pip installed from pyproject.toml (`make venv`: an editable install).
SCRIPTS = Path(sys.executable).parent
COMPLETER = "kubectl_complete-cronlock"


@pytest.fixture
def path(controlplane: ControlPlane, tmp_path: Path) -> Path:
    """A PATH directory with the real kubectl and the plugin's two executables as pip
    installed them."""
    kubectl = shutil.which("kubectl", path=controlplane.env["PATH"])
    assert kubectl, "the control plane's kubectl"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").symlink_to(kubectl)
    for name in ("kubectl-cronlock", COMPLETER):
        assert (SCRIPTS / name).is_file(), (
            f"{name} is not installed: pyproject's scripts, make venv"
        )
        (bin_dir / name).symlink_to(SCRIPTS / name)
    return bin_dir


def tab(bin_dir: Path, line: str) -> list[str]:
    """What fish offers for `line` through kubectl's own fish completion."""
    done = subprocess.run(
        ["fish", "--no-config", "-c", f"kubectl completion fish | source; complete -C'{line}'"],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(bin_dir.parent)},
        capture_output=True, text=True, timeout=60, check=True, cwd=ROOT,
    )  # fmt: skip
    return [word.split("\t")[0] for word in done.stdout.splitlines()]


def test_the_package_installs_the_completer_beside_the_plugin() -> None:
    with (ROOT / "pyproject.toml").open("rb") as file:
        scripts = tomllib.load(file)["project"]["scripts"]
    assert scripts[COMPLETER] == "cronlock_operator.status:kubectl_complete"
    assert scripts["kubectl-cronlock"] == "cronlock_operator.status:main"


def test_kubectl_cronlock_tab_completes_the_plugins_words(path: Path) -> None:
    assert tab(path, "kubectl cronlock st") == ["status"]
    assert set(tab(path, "kubectl cronlock ")) >= {"status", "lint", "freeze", "unfreeze"}
    assert tab(path, "kubectl cronlock status -o js") == ["json"]
    assert tab(path, "kubectl cronlock freeze --stop") == ["--stop-running"]
    assert tab(path, "kubectl cronlock unf") == ["unfreeze"]
    # lint's manifests: the completer says "file names", and the shell offers them.
    assert tab(path, "kubectl cronlock lint manifests/exam") == ["manifests/examples/"]


def test_without_the_completer_kubectl_offers_nothing_of_the_plugin(path: Path) -> None:
    (path / COMPLETER).unlink()
    assert "status" not in tab(path, "kubectl cronlock st")
    done = subprocess.run(
        [str(path / "kubectl"), "__complete", "cronlock", "st"],
        env={"PATH": f"{path}:/usr/bin:/bin", "HOME": str(path.parent)},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    # kubectl's own answer: no word, and the shell's file names (ShellCompDirectiveDefault).
    assert done.stdout.splitlines() == [":0"], done.stdout
