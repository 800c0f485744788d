"""The krew plugin as a user gets it: `hack/krew` (what the release workflow's `krew` job
runs) builds the four platform archives and krew's manifest with the package index
unreachable, from the hash-checked wheels fetched before (tests/controlplane/prebuild);
krew's own validation (`validate-krew-manifest`, which runs `kubectl krew install` for
every platform through the real kubectl) passes; and the plugin krew installs here runs as
`kubectl cronlock` with a Python that has nothing installed, against the real API server.
An index that serves another build backend, or a changed wheel in the cache, is refused
before any of its code runs (N3)."""

from __future__ import annotations

import functools
import http.server
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from cronlock_sidecar import contract
from tests.support import gen
from tests.support.controlplane import ControlPlane
from tests.support.paths import CACHE, ROOT
from tests.support.tools import gotool

pytestmark = pytest.mark.timeout(600)
PLATFORMS = {
    ("linux", "amd64"): "x86_64-linux-gnu",
    ("linux", "arm64"): "aarch64-linux-gnu",
    ("darwin", "amd64"): "darwin",
    ("darwin", "arm64"): "darwin",
}
PYTHONS = ("311", "312", "313", "314")
KREW = ROOT / "hack" / "krew"
# Where prebuild --tools fetches hack/krew's wheels (one test run alone fetches them here).
WHEELS = CACHE / "krew" / "wheels"
# Nothing reachable: the discard port, and pip told to use no index at all.
NO_INDEX = {
    "PIP_INDEX_URL": "http://127.0.0.1:9/",
    "PIP_NO_INDEX": "1",
    "HTTP_PROXY": "http://127.0.0.1:9/",
    "HTTPS_PROXY": "http://127.0.0.1:9/",
}


@pytest.fixture(scope="module")
def wheels() -> Path:
    """The hash-checked wheels hack/krew builds from: fetched before the tests (prebuild
    --tools), so nothing to do here then; fetched now (with the index) when missing."""
    fetched = subprocess.run(
        [sys.executable, str(KREW), "--wheels", str(WHEELS), "--fetch-only"],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert fetched.returncode == 0, fetched.stderr[-3000:]
    return WHEELS


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, wheels: Path) -> Iterator[dict[str, Any]]:
    """hack/krew's archives and manifest, their download URL a local HTTP server's."""
    dist = tmp_path_factory.mktemp("krew-dist")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(dist))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    made = subprocess.run(
        [sys.executable, str(KREW), "--wheels", str(wheels), "--dist", str(dist),
         "--base-url", url],
        env={**os.environ, **NO_INDEX}, capture_output=True, text=True, check=False,
        timeout=300,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
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
            # pip's note of the scratch path the wheel came from would differ on every run.
            assert not [name for name in names if name.endswith("/direct_url.json")]
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
    body = gen.cronjob("report", gen.in_namespace(namespace), gen.restart_policy("Never"))
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
    # `kubectl cronlock <TAB>`: the completer the manifest's caveats tell the user to write
    # into krew's bin, run as written; kubectl then asks it (and without it, nothing).
    caveats = yaml.safe_load(Path(built["manifest"]).read_text())["spec"]["caveats"]
    setup = caveats.split("(krew links only kubectl-cronlock):\n", 1)[1]
    assert "kubectl_complete-cronlock" in setup
    ask = ["kubectl", "__complete", "cronlock", "status", "-o", "js"]
    before = subprocess.run(ask, env=env, capture_output=True, text=True, check=True, timeout=60)
    assert "json" not in before.stdout
    subprocess.run(["bash", "-euc", setup], env=env, check=True, timeout=30)
    completed = subprocess.run(ask, env=env, capture_output=True, text=True, check=True, timeout=60)
    assert completed.stdout.splitlines() == ["json", ":4"], completed.stdout + completed.stderr


def _evil_wheel(directory: Path, version: str, marker: Path) -> Path:
    """A wheel named hatchling `version` whose import writes `marker`: what a backdoored
    release of the build backend would run in the job that builds the plugin."""
    wheel = directory / f"hatchling-{version}-py3-none-any.whl"
    code = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
    info = f"hatchling-{version}.dist-info"
    files = {
        "hatchling/__init__.py": code,
        "hatchling/build.py": code,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: hatchling\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return wheel


@pytest.fixture
def evil_index(tmp_path: Path, wheels: Path) -> Iterator[tuple[str, Path]]:
    """A package index (PEP 503) on loopback that serves requirements-build.lock's wheels,
    but hatchling as an attacker's: its locked version and a newer one. Yields the index's
    URL and the file its hatchling writes when imported."""
    marker = tmp_path / "backend-ran"
    simple = tmp_path / "index" / "simple"
    for name in ("hatchling", "packaging", "pathspec", "pluggy", "tomlkit", "trove-classifiers"):
        (simple / name).mkdir(parents=True)
    hatchling = [_evil_wheel(simple / "hatchling", v, marker) for v in ("1.33.0", "99.0.0")]
    real = sorted((wheels / "build").glob("*.whl"))
    assert len(real) == 6, real
    for wheel in real:
        project = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
        if project != "hatchling":
            shutil.copy(wheel, simple / project / wheel.name)
    for project in simple.iterdir():
        links = "".join(f'<a href="{w.name}">{w.name}</a>\n' for w in project.glob("*.whl"))
        (project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    assert all(wheel.exists() for wheel in hatchling)
    handler = functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "index")
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple/", marker
    server.shutdown()
    server.server_close()


def test_an_index_serving_another_build_backend_is_refused_before_it_runs(
    evil_index: tuple[str, Path], tmp_path: Path
) -> None:
    """The release job's case: nothing fetched yet, the index compromised. The lock's
    hashes refuse the backend before a line of it runs; with pip's build isolation (the
    N3 finding) the newer one would be installed and imported."""
    url, marker = evil_index
    env = {**os.environ, "PIP_INDEX_URL": url}
    env.pop("PIP_NO_INDEX", None)
    env.pop("PIP_FIND_LINKS", None)
    made = subprocess.run(
        [sys.executable, str(KREW), "--wheels", str(tmp_path / "wheels"),
         "--dist", str(tmp_path / "dist")],
        env=env, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert made.returncode != 0
    assert "DO NOT MATCH THE HASHES" in made.stderr, made.stderr[-3000:]
    assert "hack/krew: fetching the locked wheels into" in made.stderr
    assert not marker.exists(), "the attacker's backend ran"
    assert not (tmp_path / "dist").exists()
    # The same index, asked as pip's build isolation asks it (hatchling>=1.27, no hash),
    # hands out the attacker's newest: this is what the lock's hashes keep out.
    chosen = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d",
         str(tmp_path / "isolation"), "hatchling>=1.27"],
        env=env, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert chosen.returncode == 0, chosen.stderr
    assert [w.name for w in (tmp_path / "isolation").iterdir()] == [
        "hatchling-99.0.0-py3-none-any.whl"
    ]


def test_a_changed_wheel_in_the_fetched_cache_is_refused_before_it_runs(
    tmp_path: Path, wheels: Path
) -> None:
    """Someone who can write the cache swaps the backend's wheel for theirs: the build,
    which reads only the cache, checks the lock's hashes again and stops."""
    changed = tmp_path / "wheels"
    shutil.copytree(wheels / "build", changed / "build")
    shutil.copy(wheels / "fetched.json", changed / "fetched.json")  # "fetched": no refetch
    marker = tmp_path / "backend-ran"
    [locked] = (changed / "build").glob("hatchling-*.whl")
    locked.unlink()
    _evil_wheel(changed / "build", locked.name.split("-")[1], marker)
    made = subprocess.run(
        [sys.executable, str(KREW), "--wheels", str(changed), "--dist", str(tmp_path / "dist")],
        env={**os.environ, **NO_INDEX}, capture_output=True, text=True, check=False,
        timeout=300,
    )  # fmt: skip
    assert made.returncode != 0
    assert "DO NOT MATCH THE HASHES" in made.stderr, made.stderr[-3000:]
    assert not marker.exists(), "the changed backend ran"
    assert not list((tmp_path / "dist").glob("*.tar.gz"))


def test_a_changed_compiled_module_in_the_fetched_cache_is_refused(
    tmp_path: Path, wheels: Path
) -> None:
    """pydantic-core's wheels for the other platforms are unpacked by hack/krew itself, not
    installed by pip: it checks their hashes against the lock, and that one of each is
    there for every Python."""
    loader = importlib.machinery.SourceFileLoader("hack_krew", str(KREW))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("hack_krew", loader))
    loader.exec_module(module)
    locked = module.lock_entries("requirements.lock")
    native = tmp_path / "native" / "manylinux2014_aarch64"
    shutil.copytree(wheels / "native" / "manylinux2014_aarch64", native)
    module.add_native(locked, native, tmp_path / "lib")
    assert len(list((tmp_path / "lib").rglob("*.so"))) == len(PYTHONS)
    first, *_ = sorted(native.glob("*.whl"))
    first.write_bytes(first.read_bytes() + b"\0")
    with pytest.raises(SystemExit, match=r"is no wheel requirements\.lock lists for pydantic-core"):
        module.add_native(locked, native, tmp_path / "changed")
    assert not (tmp_path / "changed").exists()
    first.unlink()
    with pytest.raises(SystemExit, match="not one wheel of pydantic-core for each of CPython"):
        module.add_native(locked, native, tmp_path / "missing")
