"""One version, set in pyproject.toml's [project] table: the chart, its images, the rendered
manifest, the operator's default sidecar and the docs' examples all carry that one
(docs/RELEASING.md says what to bump)."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from typing import Any

import yaml

from cronlock_operator.cli import DEFAULT_SIDECAR_IMAGE
from cronlock_sidecar import contract
from tests.support.paths import ROOT

CHART = ROOT / "charts" / "cronlock"
SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?")
# cronlock's two images with a version tag, as a manifest or an example names them.
IMAGE_TAG = re.compile(r"cronlock(?:-sidecar)?:(\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?)")
# The chart from a registry, as the install commands in the docs name it.
CHART_VERSION = re.compile(r"charts/cronlock --version (\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?)")
# A release's record, as the docs name its file.
RECORD = re.compile(r"release-(\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?)\.json")


def version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def chart() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return loaded


def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return loaded


def test_the_version_is_semver() -> None:
    assert SEMVER.fullmatch(version()), f"pyproject.toml's version {version()!r} is not SemVer"


def test_the_chart_and_its_app_have_the_package_version() -> None:
    assert (chart()["version"], chart()["appVersion"]) == (version(), version()), (
        "set charts/cronlock/Chart.yaml's version and appVersion to pyproject.toml's"
    )


def test_the_installed_package_has_the_version_of_pyproject() -> None:
    # The operator reports this one (cronlock_build_info); `make` reinstalls on a change.
    assert metadata.version("cronlock") == version()


def test_the_default_image_tags_are_the_app_version() -> None:
    # Empty tags render as the chart's appVersion (_helpers.tpl), so they follow it.
    assert values()["image"]["tag"] == ""
    assert values()["sidecarImage"]["tag"] == ""
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    assert "(.image.tag | default .root.Chart.AppVersion)" in helpers


def test_artifact_hub_lists_the_default_images_at_this_version() -> None:
    listed = yaml.safe_load(chart()["annotations"]["artifacthub.io/images"])
    expected = [
        f"{values()['image']['repository']}:{version()}",
        f"{values()['sidecarImage']['repository']}:{version()}",
        f"{values()['sidecarStoresImage']['repository']}:{version()}",
    ]
    assert [image["image"] for image in listed] == expected


def test_what_version_says_is_this_version() -> None:
    assert version() == contract.VERSION


def test_the_operator_injects_the_sidecar_of_this_version_by_default() -> None:
    expected = f"{values()['sidecarImage']['repository']}:{version()}"
    assert expected == DEFAULT_SIDECAR_IMAGE


def test_the_rendered_manifest_carries_this_version() -> None:
    manifest = (ROOT / "manifests" / "install.yaml").read_text()
    charts = set(re.findall(r"helm\.sh/chart: cronlock-(\S+)", manifest))
    apps = set(re.findall(r'app\.kubernetes\.io/version: "([^"]+)"', manifest))
    images = set(IMAGE_TAG.findall(manifest))
    assert (charts, apps, images) == ({version()}, {version()}, {version()}), (
        "regenerate manifests/install.yaml (its header says how)"
    )


def test_the_changelog_has_a_section_for_this_version_below_unreleased() -> None:
    headings = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert headings[:1] == ["Unreleased"]
    assert version() in headings[1:2], f"CHANGELOG.md has no `## [{version()}]` under Unreleased"


def test_the_image_tags_in_the_docs_examples_are_this_version() -> None:
    texts = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").glob("*.md"))]
    stale = {
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in texts
        for pattern in (IMAGE_TAG, CHART_VERSION, RECORD)
        for match in pattern.finditer(path.read_text())
        if match.group(1) != version()
    }
    assert not stale, sorted(stale)


def test_the_readme_installs_this_version_from_the_registry() -> None:
    # Install from ghcr.io, install from your registry, upgrade for monitoring: all this one.
    found = CHART_VERSION.findall((ROOT / "README.md").read_text())
    assert len(found) >= 2, found
    assert set(found) == {version()}, found


# Keep a Changelog 1.1.0's kinds of change, in its order.
CHANGE_KINDS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")


def test_the_changelog_keeps_a_changelogs_form() -> None:
    """Each version: a date (but Unreleased), only Keep a Changelog's six kinds of change, in
    their order, none twice or empty, every entry a bullet; a new thing is Added, not Changed."""
    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.split(r"^## ", text, flags=re.M)[1:]
    assert versions, "CHANGELOG.md has no versions"
    problems = []
    for section in versions:
        title, _, body = section.partition("\n")
        if title != "[Unreleased]" and not re.fullmatch(
            r"\[\d+\.\d+\.\d+\S*\] - \d{4}-\d{2}-\d{2}", title
        ):
            problems.append(f"{title!r}: a version is `[X.Y.Z] - YYYY-MM-DD`")
        kinds = re.findall(r"^### (.+)$", body, flags=re.M)
        unknown = [kind for kind in kinds if kind not in CHANGE_KINDS]
        if unknown:
            problems.append(f"{title}: {unknown} are not kinds of change {CHANGE_KINDS}")
        known = [kind for kind in kinds if kind in CHANGE_KINDS]
        if known != sorted(set(known), key=CHANGE_KINDS.index):
            problems.append(f"{title}: kinds {known} twice or out of order")
        for kind, entries in re.findall(r"^### (.+)\n((?:(?!^##).*\n?)*)", body, flags=re.M):
            lines = [line for line in entries.splitlines() if line.strip()]
            if not lines:
                problems.append(f"{title} {kind}: empty")
            # A lead-in paragraph may come before the first entry; after it, only entries.
            first = next((i for i, line in enumerate(lines) if line.startswith("- ")), len(lines))
            stray = [line for line in lines[first:] if not line.startswith(("- ", "  "))]
            if first == len(lines):
                problems.append(f"{title} {kind}: no entry")
            if stray:
                problems.append(f"{title} {kind}: not a bullet: {stray[0]!r}")
            if kind == "Changed":
                new = [
                    line
                    for line in lines
                    if re.match(r"- (New |An? new |Added |An opt-in |`cronlock \w+` \w+ new)", line)
                ]
                if new:
                    problems.append(f"{title} Changed: a new thing belongs in Added: {new[0]!r}")
    assert not problems, problems
