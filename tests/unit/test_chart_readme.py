"""charts/cronlock/README.md is what helm-docs makes of Chart.yaml and values.yaml's `# --`
comments (charts/readme, the pinned helm-docs built once from its Go module), and every
value has a description there."""

from __future__ import annotations

import functools
import subprocess
from typing import Any

import pytest
import yaml

from tests.support.paths import ROOT

CHART = ROOT / "charts" / "cronlock"
README = CHART / "README.md"

# The first run on a machine builds helm-docs (module download and compile).
pytestmark = pytest.mark.timeout(600)


@functools.cache
def generated() -> str:
    result = subprocess.run(
        [str(ROOT / "charts" / "readme"), "--dry-run"],
        capture_output=True,
        text=True,
        check=False,
        timeout=590,
    )
    assert result.returncode == 0, result.stderr
    # helm-docs logs a chart it could not read and prints nothing for it.
    assert result.stdout.strip(), result.stderr
    return result.stdout


def rows(readme: str) -> dict[str, str]:
    """The values table: key -> description."""
    table = readme.split("## Values", 1)[1]
    found = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if len(cells) == 4 and cells[0] not in {"Key", "-----"} and not set(cells[0]) <= {"-"}:
            found[cells[0]] = cells[3]
    return found


def leaves(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        return [key for name, value in node.items() for key in leaves(value, f"{prefix}{name}.")]
    return [prefix.rstrip(".")]


def test_the_chart_readme_is_what_helm_docs_generates() -> None:
    assert README.read_text() == generated(), (
        "charts/cronlock/README.md is stale: run `make chart-readme`"
    )


def test_every_value_has_a_description_in_the_readme() -> None:
    documented = rows(generated())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = [
        key
        for key in leaves(values)
        if not any(key == row or key.startswith(row + ".") for row in documented)
    ]
    assert not missing, f"values without a row in the README: {missing}"
    undescribed = [key for key, description in documented.items() if not description]
    assert not undescribed, f"values.yaml keys without a `# --` comment: {undescribed}"


def test_the_readme_names_the_chart_version_and_kubernetes_requirement() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    readme = generated()
    assert f"![Version: {chart['version']}]" in readme
    assert f"Kubernetes: `{chart['kubeVersion']}`" in readme
    assert "--reset-then-reuse-values" in readme
