"""The layers in docs/DESIGN.md hold: `lint-imports` (pyproject.toml's contracts) passes on
the tree as it is and fails, naming the contract, when a pure module imports the client or
a test ring takes a helper from another ring."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
OPERATOR = "operator/src/cronlock_operator"


PACKAGES = ("operator/src", "sidecar/src", "tests")


def lint(source_root: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports over the packages under `source_root` (operator/src, sidecar/src, tests)."""
    paths = [str(source_root / "operator" / "src"), str(source_root / "sidecar" / "src")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(source_root), *paths]))
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=source_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_tree_keeps_every_contract() -> None:
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        (f"{OPERATOR}/cronjob/config.py", "import kubernetes", "The pure core"),
        (
            f"{OPERATOR}/reconcile/cronjobs.py",
            "from cronlock_operator.kube import writes",
            "The pure core",
        ),
        (
            "sidecar/src/cronlock_sidecar/holding/lease.py",
            "import cronlock_operator",
            "never imports the operator",
        ),
        (
            "sidecar/src/cronlock_sidecar/commands/hold.py",
            "import urllib3",
            "only the standard library",
        ),
        (
            "sidecar/src/cronlock_sidecar/lock/model.py",
            "from cronlock_sidecar.holding import lease",
            "no layer imports one above it",
        ),
        (
            "sidecar/src/cronlock_sidecar/logline.py",
            "from cronlock_sidecar import logformat",
            "no layer imports one above it",
        ),
        (
            "sidecar/src/cronlock_sidecar/transport/seam.py",
            "from cronlock_sidecar.stores import url",
            "no layer imports one above it",
        ),
        (
            "sidecar/src/cronlock_sidecar/lock/model.py",
            "from cronlock_sidecar.stores import documents",
            "no layer imports one above it",
        ),
        (
            f"{OPERATOR}/status/stores.py",
            "from cronlock_sidecar.stores import pgstore",
            "public surface",
        ),
        (
            "sidecar/src/cronlock_sidecar/stores/pgstore.py",
            "from cronlock_sidecar.stores.open import open_store",
            "The stores' door above the stores",
        ),
        (
            f"{OPERATOR}/kube/writes.py",
            "from cronlock_operator.runtime import reconciler",
            "no package imports one above it",
        ),
        (
            f"{OPERATOR}/cronjob/timing.py",
            "from cronlock_operator.cronjob import defaults",
            "cronjob/'s floors",
        ),
        (
            f"{OPERATOR}/runtime/executor.py",
            "from cronlock_operator.runtime import reconciler",
            "no module imports one above it",
        ),
        # One reconciler per kind: the CronJob reconciler driving the holder RBAC's (as it
        # did), or the Lease expiry reading the CronJob reconciler's state, breaks it.
        (
            f"{OPERATOR}/runtime/cronjobs.py",
            "from cronlock_operator.runtime.holder_rbac import HolderRbacReconciler",
            "Each kind's reconciler imports no other",
        ),
        (
            f"{OPERATOR}/runtime/lease_expiry.py",
            "from cronlock_operator.runtime import cronjobs",
            "Each kind's reconciler imports no other",
        ),
        (
            f"{OPERATOR}/lint/checks.py",
            "from cronlock_operator.kube import client",
            "needs no cluster",
        ),
        (
            f"{OPERATOR}/runtime/accounting.py",
            "import kubernetes",
            "named commands import kubernetes",
        ),
        (
            "tests/integration/test_stores.py",
            "from tests.e2e import scenario",
            "helpers only from tests.support",
        ),
        (
            "tests/support/kube.py",
            "from tests.reliability import checker",
            "helpers only from tests.support",
        ),
        (
            "tests/benchmarks/load.py",
            "from tests.reliability.checker import Checker",
            "reliability tool's own tests",
        ),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    copy_tree(tmp_path)
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    result = lint(tmp_path)
    assert result.returncode != 0, result.stdout
    assert contract in result.stdout
    assert "BROKEN" in result.stdout


def test_a_new_sidecar_module_is_private_until_named(tmp_path: Path) -> None:
    """The sidecar's public surface is an allow-list: a module added to it (here beside
    the lock model, a public one) is the sidecar's own until pyproject.toml names it."""
    copy_tree(tmp_path)
    (tmp_path / "sidecar/src/cronlock_sidecar/lock/fresh.py").write_text(
        '"""A module nobody has named public yet."""\n\nWORD = "fresh"\n'
    )
    importer = tmp_path / f"{OPERATOR}/reconcile/expiry.py"
    importer.write_text(
        importer.read_text() + "\nfrom cronlock_sidecar.lock import fresh  # noqa\n"
    )
    result = lint(tmp_path)
    assert result.returncode != 0, result.stdout
    assert "public surface BROKEN" in " ".join(result.stdout.split())
    assert "cronlock_operator.reconcile.expiry -> cronlock_sidecar.lock.fresh" in result.stdout


def copy_tree(destination: Path) -> None:
    """The packages lint-imports reads, copied under `destination`."""
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package,
            destination / package,
            ignore=shutil.ignore_patterns("__pycache__", "*.go", "*.sum", "*.mod"),
        )
