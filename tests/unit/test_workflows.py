"""The release workflow passes actionlint (with shellcheck on its `run:` steps), and
actionlint does fail a workflow with a mistake of the kinds it checks; every action is
pinned by commit, only the job behind the protected `release` environment may write, it
publishes only a tag on main, and it builds and starts the arm64 images `make test` does
not build; the krew plugin is built where nothing can be signed or pushed, and everything on
the GitHub release is signed; the images build from the base by digest; the test workflow
runs what CI runs on every pull request."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.tools import gotool
from tests.support.versions import compatible_releases

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
    assert [f.name for f in files] == ["compat.yml", "release.yml", "test.yml"]
    result = lint(actionlint, *files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_fails_an_unknown_permission_and_an_unquoted_expansion(
    actionlint: str, tmp_path: Path
) -> None:
    text = (WORKFLOWS / "release.yml").read_text()
    broken = text.replace("packages: write", "pakages: write", 1).replace(
        'echo "version=$version" >> "$GITHUB_OUTPUT"', "echo version=$version >> $GITHUB_OUTPUT", 1
    )
    assert broken != text
    workflow = tmp_path / ".github" / "workflows" / "release.yml"
    workflow.parent.mkdir(parents=True)
    workflow.write_text(broken)
    result = lint(actionlint, workflow)
    assert result.returncode == 1
    assert 'unknown permission scope "pakages"' in result.stdout
    assert "SC2086" in result.stdout  # shellcheck, through actionlint


# `uses: owner/repo[/path]@<40 hex> # vX.Y.Z`: a tag can be moved to other code, a commit
# cannot; the comment says which release the commit is, for whoever bumps it.
_USES_LINE = re.compile(r"^\s*(?:-\s+)?uses:\s*(?P<ref>[^\s#]+)(?P<rest>.*)$")
_PINNED = re.compile(r"^[\w.-]+/[\w.-]+(?:/[\w.-]+)*@[0-9a-f]{40}$")
_VERSION_COMMENT = re.compile(r"^\s+# v\d+\.\d+\.\d+$")
_WRITE_SCOPES = {"packages", "id-token", "contents", "attestations", "deployments"}


def _workflows() -> dict[str, dict[str, Any]]:
    return {path.name: yaml.safe_load(path.read_text()) for path in sorted(WORKFLOWS.glob("*.yml"))}


def _yaml_uses(workflow: dict[str, Any]) -> list[str]:
    """Every `uses:` as YAML reads it: job-level (reusable workflows) and each step's."""
    found = []
    for job in workflow["jobs"].values():
        if "uses" in job:
            found.append(str(job["uses"]))
        found.extend(str(step["uses"]) for step in job.get("steps", []) if "uses" in step)
    return found


def test_every_action_is_pinned_by_a_commit_with_its_release_in_a_comment() -> None:
    unpinned = []
    for path in sorted(WORKFLOWS.glob("*.yml")):
        lines = [_USES_LINE.match(line) for line in path.read_text().splitlines()]
        refs = [match for match in lines if match is not None]
        # The line scan sees every `uses:` YAML sees (none hides in a flow mapping).
        assert sorted(match["ref"] for match in refs) == sorted(
            _yaml_uses(yaml.safe_load(path.read_text()))
        ), path.name
        unpinned += [
            f"{path.name}: {match.group(0).strip()}"
            for match in refs
            if not (_PINNED.match(match["ref"]) and _VERSION_COMMENT.match(match["rest"]))
        ]
    assert unpinned == []


def _writes(job: dict[str, Any]) -> bool:
    permissions = job.get("permissions") or {}
    if isinstance(permissions, str):  # read-all, write-all
        return permissions == "write-all"
    return any(permissions.get(scope) == "write" for scope in _WRITE_SCOPES)


def test_only_jobs_in_the_protected_release_environment_get_write_rights() -> None:
    publishing = []
    for name, workflow in _workflows().items():
        assert workflow["permissions"] == {}, f"{name}: no rights unless a job asks"
        for job_name, job in workflow["jobs"].items():
            assert "permissions" in job, f"{name}: job {job_name} states its rights"
            if _writes(job):
                environment = job.get("environment")
                if isinstance(environment, dict):
                    environment = environment.get("name")
                assert environment == "release", f"{name}: job {job_name} writes ungated"
                publishing.append(job_name)
    assert publishing == ["release", "github-release"]


def test_the_release_builds_and_starts_arm64_which_make_test_does_not() -> None:
    """`make test` releases the host's platform alone (tests/controlplane/images), so the
    workflow names both platforms itself, not through a default, sets up arm64 emulation,
    and starts each arm64 image's command before anything is signed."""
    steps = yaml.safe_load((WORKFLOWS / "release.yml").read_text())["jobs"]["release"]["steps"]
    runs = [step.get("run", "") for step in steps]
    (release,) = [i for i, run in enumerate(runs) if run.startswith("make release ")]
    assert "PLATFORMS=linux/amd64,linux/arm64" in runs[release].split()
    (qemu,) = [i for i, step in enumerate(steps) if "setup-qemu-action" in step.get("uses", "")]
    assert qemu < release
    assert steps[qemu]["with"]["platforms"] == "arm64"
    (started,) = [i for i, run in enumerate(runs) if "podman run" in run]
    signed = [i for i, run in enumerate(runs) if "cosign sign" in run]
    assert len(signed) == 2  # the images and the chart, then the GitHub release's files
    assert release < started < min(signed)
    assert "for key in operator sidecar sidecar-stores;" in runs[started]
    assert runs[started].count("--platform linux/arm64") == 2
    assert "--help" in runs[started]
    # `make release` anywhere else: both platforms unless PLATFORMS says otherwise.
    makefile = (ROOT / "Makefile").read_text()
    assert "\nPLATFORMS ?= linux/amd64,linux/arm64\n" in makefile
    assert "\tPLATFORMS=$(PLATFORMS) hack/release\n" in makefile


def _ancestry_check(workflow: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The job the publishing job needs that checks the tag is on main, and that check."""
    jobs = workflow["jobs"]
    needs = jobs["release"].get("needs", [])
    for name in ["release", *([needs] if isinstance(needs, str) else needs)]:
        for step in jobs[name]["steps"]:
            if "merge-base --is-ancestor" in step.get("run", ""):
                return jobs[name], step["run"]
    raise AssertionError("no job the release job needs checks that the tag is on main")


def _git(cwd: Path, *args: str) -> str:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(cwd),
        "GIT_CONFIG_NOSYSTEM": "1",
        **{
            f"GIT_{who}_{what}": value
            for who in ("AUTHOR", "COMMITTER")
            for what, value in (("NAME", "t"), ("EMAIL", "t@example.com"))
        },
    }
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.fixture
def clone(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A clone, as checkout with fetch-depth 0 leaves it, of a repository where main has
    commits `old` and `head` and branch `side` forks from `old` with commit `side`."""
    origin = tmp_path / "origin"
    origin.mkdir()
    _git(origin, "init", "--quiet", "--initial-branch=main")
    commits: dict[str, str] = {}
    for name in ("old", "head"):
        _git(origin, "commit", "--quiet", "--allow-empty", "-m", name)
        commits[name] = _git(origin, "rev-parse", "HEAD")
    _git(origin, "checkout", "--quiet", "-b", "side", commits["old"])
    _git(origin, "commit", "--quiet", "--allow-empty", "-m", "side")
    commits["side"] = _git(origin, "rev-parse", "HEAD")
    work = tmp_path / "work"
    _git(tmp_path, "clone", "--quiet", "--no-checkout", str(origin), str(work))
    return work, commits


def test_a_release_is_published_only_from_a_tag_on_main(
    clone: tuple[Path, dict[str, str]],
) -> None:
    job, script = _ancestry_check(yaml.safe_load((WORKFLOWS / "release.yml").read_text()))
    checkout = next(step for step in job["steps"] if "uses" in step)
    assert checkout["uses"].startswith("actions/checkout@")
    assert checkout["with"]["fetch-depth"] == 0  # else origin/main is not there to compare
    work, commits = clone

    def check(commit: str) -> subprocess.CompletedProcess[str]:
        _git(work, "checkout", "--quiet", "--detach", commit)
        return subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
            cwd=work,
            env={**os.environ, "GITHUB_SHA": commit, "GITHUB_REF_NAME": "v9.9.9"},
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )

    for on_main in ("head", "old"):
        passed = check(commits[on_main])
        assert passed.returncode == 0, (on_main, passed.stdout, passed.stderr)
    refused = check(commits["side"])
    assert refused.returncode == 1
    assert f"::error::tag v9.9.9 is on {commits['side']}, which is not on main" in refused.stdout
    # Without main's history there is nothing to compare with: refused too, saying why.
    _git(work, "update-ref", "-d", "refs/remotes/origin/main")
    unknown = check(commits["head"])
    assert unknown.returncode != 0
    assert "::error::" in unknown.stdout


def test_the_compatibility_workflow_runs_every_release_the_tests_pin_read_only() -> None:
    workflow = yaml.safe_load((WORKFLOWS / "compat.yml").read_text())
    job = workflow["jobs"]["compat"]
    assert job["strategy"]["matrix"]["kubernetes"] == compatible_releases()
    assert job["strategy"]["fail-fast"] is False, "one release failing hides no other"
    assert workflow["permissions"] == {}
    assert job["permissions"] == {"contents": "read"}
    runs = [step.get("run", "") for step in job["steps"]]
    assert any('make test-compat KUBERNETES="$KUBERNETES"' in run for run in runs)


def test_every_pull_request_runs_the_readmes_test_command_read_only() -> None:
    """The same `make test` as `.ci/run` (the README's command), on every pull request and
    on main, with no right but reading the repository."""
    workflow = yaml.safe_load((WORKFLOWS / "test.yml").read_text())
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as a boolean
    assert triggers["pull_request"] == {}
    assert triggers["push"] == {"branches": ["main"]}
    assert workflow["permissions"] == {}
    job = workflow["jobs"]["test"]
    assert job["permissions"] == {"contents": "read"}
    assert job["timeout-minutes"] == 90, "as long as CI gives a submission"
    runs = [step["run"] for step in job["steps"] if "run" in step]
    assert runs == ["sudo --preserve-env=CI make test"]
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith("\nmake test")


def _release_jobs() -> dict[str, Any]:
    jobs: dict[str, Any] = yaml.safe_load((WORKFLOWS / "release.yml").read_text())["jobs"]
    return jobs


def _runs(job: dict[str, Any]) -> list[str]:
    return [step.get("run", "") for step in job["steps"]]


def test_the_krew_plugin_is_built_in_a_job_that_can_neither_sign_nor_push() -> None:
    """N3: hack/krew runs third-party Python (the build backend, pip's resolution) outside
    any container, so only in a job with `contents: read`: no OIDC token, no registry
    login, no environment's approval; its archives reach the signing job as an artifact."""
    jobs = _release_jobs()
    building = [name for name, job in jobs.items() if any("hack/krew" in r for r in _runs(job))]
    assert building == ["krew"]
    krew = jobs["krew"]
    assert krew["permissions"] == {"contents": "read"}
    assert "environment" not in krew
    text = yaml.safe_dump(krew)
    assert "secrets." not in text
    assert "login" not in text
    assert "github.token" not in text
    checkout = krew["steps"][0]
    assert checkout["uses"].startswith("actions/checkout@")
    assert checkout["with"]["persist-credentials"] is False
    [upload] = [
        s for s in krew["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")
    ]
    assert upload["with"]["name"] == "krew-${{ env.VERSION }}"
    assert upload["with"]["if-no-files-found"] == "error"
    assert upload["with"]["path"].split() == [
        "dist/kubectl-cronlock-*.tar.gz",
        "dist/krew/cronlock.yaml",
    ]
    # The release job builds no plugin of its own (KREW=0) and takes the krew job's.
    release = jobs["release"]
    assert "krew" in release["needs"]
    [make] = [r for r in _runs(release) if r.startswith("make release ")]
    assert "KREW=0" in make.split()
    [download] = [
        s for s in release["steps"] if s.get("uses", "").startswith("actions/download-artifact@")
    ]
    assert download["with"] == {"name": "krew-${{ env.VERSION }}", "path": "dist"}
    # hack/release builds the plugin unless KREW=0; nothing else in the job runs it.
    assert "if [[ ${KREW:-1} != 0 ]]; then" in (ROOT / "hack" / "release").read_text()


def test_every_file_of_the_github_release_is_signed_after_the_plugin_arrives() -> None:
    """The archives, krew's manifest and install.yaml each get a Sigstore bundle from
    `cosign sign-blob` in the job with the OIDC token, after the krew job's artifact is
    downloaded and before the release job uploads its own; github-release attaches each
    file with its bundle."""
    jobs = _release_jobs()
    steps = jobs["release"]["steps"]
    uses = [step.get("uses", "") for step in steps]
    runs = _runs(jobs["release"])
    (download,) = [i for i, u in enumerate(uses) if u.startswith("actions/download-artifact@")]
    (upload,) = [i for i, u in enumerate(uses) if u.startswith("actions/upload-artifact@")]
    (signed,) = [i for i, run in enumerate(runs) if "cosign sign-blob" in run]
    assert download < signed < upload
    signing = runs[signed]
    files = "dist/kubectl-cronlock-*.tar.gz dist/krew/cronlock.yaml dist/install.yaml"
    assert f"for file in {files}; do" in signing
    assert 'cosign sign-blob --yes --bundle "$file.sigstore.json" "$file"' in signing
    assert jobs["release"]["permissions"]["id-token"] == "write"
    [publish] = _runs(jobs["github-release"])
    attached = publish.split("gh release create", 1)[1].split()
    for file in files.split():
        assert file in attached
        assert f"{file}.sigstore.json" in attached


def test_the_release_builds_from_the_base_image_by_digest() -> None:
    """The Dockerfile's base tag, resolved once to its index's digest before `make release`,
    which passes it to every build as BASE (hack/release: --build-arg PYTHON=)."""
    runs = _runs(_release_jobs()["release"])
    (based,) = [i for i, run in enumerate(runs) if "skopeo inspect --format" in run]
    (release,) = [i for i, run in enumerate(runs) if run.startswith("make release ")]
    assert based < release
    assert "sed -n 's/^ARG PYTHON=//p' Dockerfile" in runs[based]
    assert 'echo "BASE=$base@$digest" >> "$GITHUB_ENV"' in runs[based]
    assert 'BASE="$BASE"' in runs[release].split()
    assert '${BASE:+--build-arg "PYTHON=$BASE"}' in (ROOT / "hack" / "release").read_text()
