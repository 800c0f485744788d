"""`pip install cronlock` as a user runs it: the wheel built from this tree, installed with
its dependencies into a clean virtualenv. The CLI (`cronlock status|lint|freeze`, `kubectl
cronlock`, `cronlock-sidecar run`) works with only what it needs; the operator's packages
(kopf, prometheus-client, uvloop) come with the extra `cronlock[operator]`, and without
them `cronlock-operator` says so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cronlock_sidecar import contract
from tests.support import gen
from tests.support.paths import ROOT
from tests.support.ports import free_port

pytestmark = pytest.mark.timeout(600)

OPERATOR_ONLY = {"kopf", "prometheus-client", "uvloop"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin directory of a fresh virtualenv with `pip install cronlock-<version>.whl`."""
    top = tmp_path_factory.mktemp("wheel")
    quiet = ("--quiet", "--disable-pip-version-check")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", *quiet, "--no-deps", "-w", str(top / "dist"),
         str(ROOT)],
        check=True, timeout=300,
    )  # fmt: skip
    [wheel] = (top / "dist").glob("cronlock-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(top / "venv")], check=True, timeout=120)
    bin_dir = top / "venv" / "bin"
    subprocess.run([str(bin_dir / "pip"), "install", *quiet, str(wheel)], check=True, timeout=300)
    return bin_dir


def run(bin_dir: Path, program: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / program), *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_cli_installs_without_the_operators_packages(installed: Path) -> None:
    frozen = run(installed, "pip", "freeze").stdout.lower()
    names = {line.split("==")[0].split(" @ ")[0] for line in frozen.splitlines()}
    assert {"cronlock", "kubernetes", "pyyaml"} <= names
    assert not OPERATOR_ONLY & names, OPERATOR_ONLY & names
    for program, args in (
        ("cronlock", ()),
        ("cronlock", ("status",)),
        ("cronlock", ("lint",)),
        ("cronlock", ("freeze",)),
        ("kubectl-cronlock", ()),
        ("cronlock-sidecar", ()),
        ("cronlock-operator", ()),
    ):
        done = run(installed, program, *args, "--version")
        assert done.returncode == 0, (program, args, done.stderr)
        assert done.stdout.strip().endswith(f" {contract.VERSION}"), done.stdout


def test_the_cli_works_and_the_operator_says_what_it_needs(installed: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "cronjob.yaml"
    bad = gen.cronjob("report", gen.annotated({"cronlock.io/ttl": "soon"}))
    manifest.write_text(yaml.safe_dump(bad))
    linted = run(installed, "cronlock", "lint", str(manifest))
    assert linted.returncode == 1, linted.stdout + linted.stderr
    assert "cronlock.io/ttl" in linted.stdout + linted.stderr
    # The Kubernetes client is there: a server that refuses is exit 69 with its address.
    kubeconfig = tmp_path / "kubeconfig"
    port = free_port()
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    status = run(installed, "cronlock", "status", "--kubeconfig", str(kubeconfig))
    assert status.returncode == contract.EXIT_UNAVAILABLE, status.stderr
    assert f"127.0.0.1:{port}" in status.stderr
    operator = run(installed, "cronlock-operator")
    assert operator.returncode == contract.EXIT_CONFIG
    assert "pip install 'cronlock[operator]'" in operator.stderr
    assert "Traceback" not in operator.stderr
