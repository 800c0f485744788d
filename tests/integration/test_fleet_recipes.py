"""docs/FLEET.md's Argo CD ApplicationSet and Flux HelmReleases, applied with
`kubectl apply --dry-run=server` against those projects' own CRDs (copied from their
release tags into tests/integration/crds/) on the real API server, and the chart rendered
with each one's values."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.controlplane import ControlPlane
from tests.support.kube import run_tool, wait_for
from tests.support.operator import CHART, kube_version
from tests.support.papers import marked_block
from tests.support.paths import ROOT

FLEET_MD = ROOT / "docs" / "FLEET.md"
CRDS = Path(__file__).parent / "crds"
BLOCKS = ("fleet-argocd", "fleet-flux", "fleet-flux-helmrepository")


def fleet_block(block: str) -> str:
    """FLEET.md's block `block`, each read by its literal name (tests/unit/test_doc_blocks.py
    sees which names the tests read)."""
    return {
        "fleet-argocd": marked_block(FLEET_MD, "fleet-argocd"),
        "fleet-flux": marked_block(FLEET_MD, "fleet-flux"),
        "fleet-flux-helmrepository": marked_block(FLEET_MD, "fleet-flux-helmrepository"),
    }[block]


# The namespaces the examples live in, as each tool installs itself.
TOOL_NAMESPACES = ("argocd", "flux-system")


@pytest.fixture(scope="module")
def gitops_crds(controlplane: ControlPlane) -> Iterator[list[str]]:
    """The tools' CRDs, served; removed afterwards. Server-side: the ApplicationSet CRD
    (1.4 MB) is too large for client-side apply's last-applied annotation."""
    created = controlplane.kubectl("apply", "--server-side", "-f", str(CRDS), "-o", "name")
    names = created.split()
    assert len(names) == 4, created

    def established() -> bool:
        for name in names:
            status = json.loads(controlplane.kubectl("get", name, "-o", "json"))["status"]
            conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
            if conditions.get("Established") != "True":
                return False
        return True

    wait_for(established, timeout=60, what="the GitOps CRDs to be served")
    yield names
    controlplane.kubectl("delete", "--wait=false", *names)


def objects(block: str, namespace: str) -> list[dict[str, Any]]:
    """The block's objects, moved from the tool's namespace into the test's."""
    text = fleet_block(block)
    docs = [doc for doc in yaml.safe_load_all(text) if doc]
    for doc in docs:
        assert doc["metadata"]["namespace"] in TOOL_NAMESPACES, doc["metadata"]
        doc["metadata"]["namespace"] = namespace
    return docs


def dry_run(
    controlplane: ControlPlane, namespace: str, docs: list[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    return run_tool(
        controlplane.env,
        "kubectl", "apply", "--dry-run=server", "-n", namespace, "-f", "-",
        input_text=yaml.safe_dump_all(docs),
        check=False,
    )  # fmt: skip


def chart_values(doc: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The values and chart version an ApplicationSet or a HelmRelease gives the chart."""
    if doc["kind"] == "ApplicationSet":
        source = doc["spec"]["template"]["spec"]["source"]
        return source["helm"]["valuesObject"], source["targetRevision"]
    return doc["spec"]["values"], doc["spec"].get("chart", {}).get("spec", {}).get("version", "")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("block", BLOCKS)
def test_the_fleet_example_passes_the_server_side_dry_run(
    controlplane: ControlPlane, namespace: str, gitops_crds: list[str], block: str
) -> None:
    docs = objects(block, namespace)
    result = dry_run(controlplane, namespace, docs)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(server dry run)") == len(docs), result.stdout
    # The same objects with a misspelt field are refused: the CRDs' schemas judge them.
    docs[-1]["spec"]["intervall"] = "1h"
    refused = dry_run(controlplane, namespace, docs)
    assert refused.returncode != 0
    assert 'unknown field "spec.intervall"' in refused.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("block", BLOCKS)
def test_the_fleet_examples_values_and_version_are_the_charts(
    controlplane: ControlPlane, tmp_path: Path, block: str
) -> None:
    chart_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    text = fleet_block(block)
    docs = [doc for doc in yaml.safe_load_all(text) if doc]
    for doc in docs:
        if doc["kind"] == "OCIRepository":
            assert doc["spec"]["ref"] == {"tag": chart_version}
        if doc["kind"] not in ("ApplicationSet", "HelmRelease"):
            continue
        values, version = chart_values(doc)
        if version:
            assert version == chart_version
        given = tmp_path / "values.yaml"
        given.write_text(yaml.safe_dump(values))
        run_tool(
            controlplane.env,
            "helm", "template", "cronlock", str(CHART), "-n", "cronlock-system",
            "--kube-version", kube_version(), "-f", str(given),
        )  # fmt: skip
