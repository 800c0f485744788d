"""The krew plugin as a user gets it: `hack/krew` (what `make release` runs) builds the four
platform archives and krew's manifest; krew's own validation (`validate-krew-manifest`,
which runs `kubectl krew install` for every platform through the real kubectl) passes; and
the plugin krew installs here runs as `kubectl cronlock` with a Python that has nothing
installed, against the real API server."""

from __future__ import annotations

import functools
import http.server
import json
import re
import shutil
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from cronlock_sidecar import contract
from tests.support.controlplane import ControlPlane
from tests.support.cronjobs import make_cronjob
from tests.support.paths import ROOT
from tests.support.tools import gotool

pytestmark = pytest.mark.timeout(600)
PLATFORMS = {
    ("linux", "amd64"): "x86_64-linux-gnu",
    ("linux", "arm64"): "aarch64-linux-gnu",
    ("darwin", "amd64"): "darwin",
    ("darwin", "arm64"): "darwin",
}
PYTHONS = ("311", "312", "313", "314")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """hack/krew's archives and manifest, their download URL a local HTTP server's."""
    dist = tmp_path_factory.mktemp("krew-dist")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(dist))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    made = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "krew"), "--dist", str(dist), "--base-url", url],
        capture_output=True, text=True, check=True, timeout=540,
    )  # fmt: skip
    yield json.loads(made.stdout)
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def kubectl_path(controlplane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PATH with the real kubectl and krew as its plugin `kubectl-krew`."""
    bin_dir = tmp_path_factory.mktemp("kubectl-bin")
    kubectl = shutil.which("kubectl", path=controlplane.env["PATH"])
    assert kubectl, "the control plane's kubectl"
    (bin_dir / "kubectl").symlink_to(kubectl)
    (bin_dir / "kubectl-krew").symlink_to(gotool("krew"))
    return f"{bin_dir}:/usr/bin:/bin"


def test_krews_validation_installs_every_platform_and_each_carries_its_native_module(
    built: dict[str, Any], kubectl_path: str
) -> None:
    checked = subprocess.run(
        [gotool("validate-krew-manifest"), "-manifest", built["manifest"]],
        env={"PATH": kubectl_path, "HOME": str(Path(built["manifest"]).parent)},
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "all 4 spec.platforms installed fine" in checked.stderr
    manifest = yaml.safe_load(Path(built["manifest"]).read_text())
    assert manifest["spec"]["version"] == f"v{contract.VERSION}"
    for platform in manifest["spec"]["platforms"]:
        labels = platform["selector"]["matchLabels"]
        path, digest = built["archives"][f"{labels['os']}/{labels['arch']}"]
        assert platform["sha256"] == digest
        assert platform["uri"].endswith("/" + Path(path).name)
        with tarfile.open(path) as archive:
            names = archive.getnames()
            assert {"kubectl-cronlock", "LICENSE"} <= set(names)
            assert all(m.uid == 0 and m.gid == 0 for m in archive.getmembers())
        compiled = sorted(name for name in names if name.endswith(".so"))
        # pydantic-core's module for each Python on this platform, and nothing compiled else.
        assert len(compiled) == len(PYTHONS), compiled
        for name, python in zip(compiled, PYTHONS, strict=True):
            assert name.startswith("lib/pydantic_core/_pydantic_core.cpython-" + python), name
            assert PLATFORMS[(labels["os"], labels["arch"])] in name, name


def test_the_plugin_krew_installs_runs_on_a_bare_python_against_the_api_server(
    built: dict[str, Any],
    kubectl_path: str,
    controlplane: ControlPlane,
    api: kubernetes.client.ApiClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    root = tmp_path / "krew"
    env = {"PATH": kubectl_path, "HOME": str(tmp_path), "KREW_ROOT": str(root)}
    subprocess.run(
        ["kubectl", "krew", "install", f"--manifest={built['manifest']}"],
        env=env, capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    # A Python with nothing installed: whatever the plugin imports comes from its archive.
    bare = tmp_path / "python"
    base = Path(sys.base_prefix) / "bin" / "python3"
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(bare)], check=True, timeout=60)
    env["PATH"] = f"{root / 'bin'}:{bare / 'bin'}:{kubectl_path}"

    def plugin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", "cronlock", *args],
            env=env, capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip

    shown = plugin("--version")
    assert (shown.returncode, shown.stdout.strip()) == (0, f"kubectl cronlock {contract.VERSION}")
    body = make_cronjob(name="report", namespace=namespace, restart_policy="Never")
    kubernetes.client.BatchV1Api(api).create_namespaced_cron_job(namespace, body)
    status = plugin(
        "status", "-n", namespace, "-o", "json", "--kubeconfig", str(controlplane.kubeconfig)
    )
    assert status.returncode == 0, status.stderr
    [row] = json.loads(status.stdout)["items"]
    assert (row["cronjob"], row["state"]) == ("report", "missing")  # no operator here
    linted = plugin("lint", str(ROOT / "manifests" / "examples"))
    assert linted.returncode == 0, linted.stdout + linted.stderr
    wrong = plugin("lint")
    assert wrong.returncode == 2
    assert re.search(r"^kubectl cronlock lint: error: .*required", wrong.stderr, re.M)
