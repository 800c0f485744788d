"""Argo CD's CronJob health, run in gopher-lua (the engine Argo CD embeds) by
tests/controlplane/go/argohealth: Argo CD's own script turns a guarded CronJob whose run
skipped Degraded; ours (manifests/argocd/cronjob-health.lua) keeps it Healthy until the
skips reach alert-after, and judges every other CronJob as Argo CD's does."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import gen
from tests.support.paths import ROOT
from tests.support.tools import gotool

OURS = ROOT / "manifests" / "argocd" / "cronjob-health.lua"
PATCH = ROOT / "manifests" / "argocd" / "argocd-cm-patch.yaml"
CONTROLPLANE = ROOT / "tests" / "controlplane"


def tool(*args: str) -> str:
    return subprocess.run(
        [str(CONTROLPLANE / args[0]), *args[1:]],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout.strip()


@pytest.fixture(scope="module")
def argohealth() -> str:
    return gotool("argohealth")


@pytest.fixture(scope="module")
def argocd() -> Path:
    """Argo CD's CronJob health directory, from its pinned Go module (versions.env)."""
    return Path(tool("argocd-health"))


def health(
    argohealth: str, script: Path, *objects: dict[str, Any], tmp: Path
) -> list[dict[str, str]]:
    path = tmp / "objects.json"
    path.write_text(json.dumps(list(objects)))
    out = subprocess.run(
        [argohealth, str(script), str(path)], check=True, capture_output=True, text=True
    ).stdout
    return [json.loads(line) for line in out.splitlines()]


def skipped(skips: int, alert_after: str | None = None) -> dict[str, Any]:
    """A guarded CronJob as the CronJob controller and the operator leave it after its last
    `skips` runs skipped: scheduled since its last success, nothing active."""
    annotations = {"cronlock.io/enabled": "true", "cronlock.io/consecutive-skips": str(skips)}
    if alert_after is not None:
        annotations["cronlock.io/alert-after"] = alert_after
    return gen.cronjob(
        "report",
        gen.with_annotations(annotations),
        gen.with_status(
            {
                "lastScheduleTime": "2026-12-02T10:15:00Z",
                "lastSuccessfulTime": "2026-12-02T10:05:41Z",
            }
        ),
    )


def test_the_harness_gives_argo_cds_own_expected_results(
    argohealth: str, argocd: Path, tmp_path: Path
) -> None:
    cases = yaml.safe_load((argocd / "health_test.yaml").read_text())["tests"]
    assert len(cases) >= 5
    objects = [yaml.safe_load((argocd / case["inputPath"]).read_text()) for case in cases]
    results = health(argohealth, argocd / "health.lua", *objects, tmp=tmp_path)
    assert results == [case["healthStatus"] for case in cases]


def test_ours_gives_argo_cds_status_for_every_case_argo_cd_tests(
    argohealth: str, argocd: Path, tmp_path: Path
) -> None:
    cases = yaml.safe_load((argocd / "health_test.yaml").read_text())["tests"]
    objects = [yaml.safe_load((argocd / case["inputPath"]).read_text()) for case in cases]
    ours = health(argohealth, OURS, *objects, tmp=tmp_path)
    assert [result["status"] for result in ours] == [
        case["healthStatus"]["status"] for case in cases
    ]
    # The same CronJobs guarded by cronlock, with no skip counted, are judged the same.
    guarded = copy.deepcopy(objects)
    for body in guarded:
        body["metadata"].setdefault("annotations", {})["cronlock.io/enabled"] = "true"
    assert [r["status"] for r in health(argohealth, OURS, *guarded, tmp=tmp_path)] == [
        case["healthStatus"]["status"] for case in cases
    ]


def test_a_skip_is_degraded_for_argo_cd_and_healthy_for_ours_until_alert_after(
    argohealth: str, argocd: Path, tmp_path: Path
) -> None:
    (theirs,) = health(argohealth, argocd / "health.lua", skipped(1), tmp=tmp_path)
    assert theirs["status"] == "Degraded"  # what users saw before

    one, two, three, five_of_five, three_of_five = health(
        argohealth,
        OURS,
        skipped(1),
        skipped(2),
        skipped(3),
        skipped(5, alert_after="5"),
        skipped(3, alert_after="5"),
        tmp=tmp_path,
    )
    assert one == {
        "status": "Healthy",
        "message": "1 runs in a row skipped because another run held the lock; Degraded at 3",
    }
    assert two["status"] == "Healthy"
    assert three["status"] == "Degraded"  # the default alert-after, when RepeatedSkips fires
    assert "(RepeatedSkips)" in three["message"]
    assert five_of_five["status"] == "Degraded"
    assert three_of_five["status"] == "Healthy"


def test_a_guarded_run_that_failed_is_still_degraded(argohealth: str, tmp_path: Path) -> None:
    (failed,) = health(argohealth, OURS, skipped(0), tmp=tmp_path)
    assert failed == {"status": "Degraded", "message": "The last scheduled run did not succeed"}


def test_the_argocd_cm_patch_carries_exactly_the_script() -> None:
    patch = yaml.safe_load(PATCH.read_text())
    assert patch == {"data": {"resource.customizations.health.batch_CronJob": OURS.read_text()}}
