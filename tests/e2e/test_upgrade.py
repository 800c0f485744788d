"""Upgrade and roll back while runs hold (docs/UPGRADING.md), on the real node.

The previous release's chart and images (tests/controlplane/previous-release: a pinned
commit, built from its own Dockerfile) guard CronJobs whose runs hold their Leases; then
`helm upgrade` to the tree under test while they hold, runs under the new operator beside
the old sidecars, `helm rollback` while runs of the new sidecars hold, and runs under the
old operator again. Every run that finds its lock held must skip (exit 75); no two works
of one lock may run at once; no held Lease may go unrenewed for its duration.

The CI version guards 4 CronJobs; the long one, `CRONLOCK_UPGRADE_CRONJOBS=20
.venv/bin/pytest tests/e2e/test_upgrade.py -s`, prints the figures docs/RELIABILITY.md
records.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from tests.e2e.scenario import UNTIL_FINISHED, Scenario
from tests.support.contract import EXIT_SKIPPED, SIDECAR_CONTAINER
from tests.support.controlplane import ControlPlane
from tests.support.helm import (
    CHART,
    PREVIOUS_IMAGES,
    helm,
    image_values,
    install,
    previous_chart,
    previous_commit,
    previous_images,
)
from tests.support.kube import wait_for
from tests.support.node import (
    CRONLOCK_IMAGE,
    LeaseRecorder,
    PodRecorder,
    RealNode,
    WorkTracker,
    overlapping,
    wall_time,
)
from tests.support.operator import SIDECAR_IMAGE
from tests.support.papers import marked_block, run_shell
from tests.support.paths import ROOT, SIDECAR

pytestmark = pytest.mark.controlplane

UPGRADING = ROOT / "docs" / "UPGRADING.md"

CRONJOBS = int(os.environ.get("CRONLOCK_UPGRADE_CRONJOBS") or 4)
TTL = 19  # the operator's shortest: a missed renewal shows within seconds
RENEW = TTL / 3  # the sidecar's default renew interval
# Holds from the first phase to the last and past them, whatever they take: no work window
# (issue 55); the works end with the test's namespace.
HOLD = UNTIL_FINISHED
ENV_OPERATOR_VERSION = "CRONLOCK_OPERATOR_VERSION"


def renewal_gaps(recorder: LeaseRecorder) -> dict[str, list[float]]:
    """Per Lease and holder: the times between its renewals, from every version the watch
    saw (tests/support/node.py's LeaseRecorder)."""
    seen: dict[str, list[float]] = {}
    for version in recorder.versions():
        if version.holder and version.renew_time is not None:
            times = seen.setdefault(f"{version.name}/{version.holder}", [])
            if not times or times[-1] != version.renew_time:
                times.append(version.renew_time)
    return {key: [b - a for a, b in itertools.pairwise(times)] for key, times in seen.items()}


def paper_env(controlplane: ControlPlane) -> dict[str, str]:
    """The cluster's environment with this venv's `cronlock` first on PATH, as a user has it."""
    return dict(controlplane.env, PATH=f"{SIDECAR.parent}{os.pathsep}{controlplane.env['PATH']}")


def upgrade_block(release: str, namespace: str) -> str:
    """docs/UPGRADING.md's upgrade, run as written but for what stands for this test: the
    tree's chart for the release `<N>` from the registry, this release and namespace, and
    the images built here (the chart's defaults name published ones), pulled never."""
    block = marked_block(UPGRADING, "upgrade-release")
    published = "oci://ghcr.io/cronlock/charts/cronlock --version <N>"
    reuse = "--reset-then-reuse-values --wait"
    steps = ("helm upgrade cronlock ", published, "-n cronlock-system", reuse)
    assert all(step in block for step in steps), block
    images = shlex.join(image_values(CRONLOCK_IMAGE, SIDECAR_IMAGE, namespace))
    return (
        block.replace("helm upgrade cronlock ", f"helm upgrade {release} ")
        .replace(published, str(CHART))
        .replace("-n cronlock-system", f"-n {namespace}")
        .replace(reuse, f"{reuse.split()[0]} {images} --wait --timeout 180s")
    )


def rollback_block(release: str, namespace: str) -> str:
    """docs/UPGRADING.md's rollback to the install's revision, 1."""
    block = marked_block(UPGRADING, "rollback")
    steps = ("helm rollback cronlock <revision> -n cronlock-system --wait",)
    assert all(step in block for step in steps), block
    return block.replace(
        steps[0], f"helm rollback {release} 1 -n {namespace} --wait --timeout 180s"
    )


@pytest.fixture(scope="module")
def previous_release(node: RealNode) -> None:
    """The previous release's images on the node (built by `make test` before the rings)."""
    for archive in previous_images():
        node.import_image(archive)


@pytest.fixture
def scene(
    api: kubernetes.client.ApiClient, namespace: str, node: RealNode, tracker: WorkTracker
) -> Iterator[Scenario]:
    recorder = PodRecorder(api, namespace)
    recorder.start()
    yield Scenario(api, namespace, node, None, tracker, recorder)  # type: ignore[arg-type]
    recorder.stop()


def sidecar(cronjob: dict[str, Any]) -> dict[str, Any]:
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return next(c for c in pod.get("initContainers") or [] if c["name"] == SIDECAR_CONTAINER)


def injected_with(scene: Scenario, name: str, image: str, stamped: bool) -> dict[str, Any] | None:
    """The CronJob once its sidecar is `image`, carrying the operator's version or not."""
    cronjob = scene.read_cronjob(name)
    try:
        container = sidecar(cronjob)
    except StopIteration:
        return None
    names = {item["name"] for item in container.get("env") or []}
    return (
        cronjob
        if container["image"] == image and (ENV_OPERATOR_VERSION in names) == stamped
        else None
    )


def reinjected(scene: Scenario, names: list[str], image: str, stamped: bool) -> dict[str, int]:
    """Wait until every CronJob carries `image`; its generation then, by name."""
    found = {}
    for name in names:
        cronjob = wait_for(
            lambda name=name: injected_with(scene, name, image, stamped),  # type: ignore[misc]
            120,
            f"CronJob {name} injected with {image}",
        )
        found[name] = int(cronjob["metadata"]["generation"])
    return found


def contend(scene: Scenario, names: list[str], phase: str) -> list[int]:
    """A run of each CronJob while its lock is held: each must skip (exit 75)."""
    for name in names:
        scene.run(name, f"{name}-{phase}")
    return [scene.gate_exit(f"{name}-{phase}", timeout=120) for name in names]


def hold(scene: Scenario, names: list[str], phase: str) -> None:
    for name in names:
        scene.run(name, f"{name}-{phase}")
    for name in names:
        scene.main_running(f"{name}-{phase}", timeout=120)


def leases_renewed_since(scene: Scenario, names: list[str], since: float) -> None:
    """Each lock's Lease renewed after `since` (epoch seconds) by a holder."""

    def renewed(name: str) -> bool:
        spec = scene.lease(name)["spec"]
        at = wall_time(spec.get("renewTime"))
        return bool(spec.get("holderIdentity")) and at is not None and at > since

    for name in names:
        wait_for(lambda name=name: renewed(name), 3 * RENEW + 5, f"a renewal of {name}'s Lease")  # type: ignore[misc]


@pytest.mark.timeout(900)
def test_upgrade_and_rollback_while_runs_hold_skip_every_contender_and_never_overlap(
    controlplane: ControlPlane, scene: Scenario, tmp_path: Path, previous_release: None
) -> None:
    namespace = scene.namespace
    old_chart = previous_chart(tmp_path)
    release, _ = install(
        controlplane, namespace, chart=old_chart, images=PREVIOUS_IMAGES, restricted=False
    )
    watch = LeaseRecorder(scene.api, namespace)
    watch.start()
    report: dict[str, Any] = {"previous": previous_commit()[:12], "cronjobs": CRONJOBS}
    try:
        names = [f"up{index}" for index in range(CRONJOBS)]
        early, late = names[0::2], names[1::2]  # hold from the start; hold from the upgrade
        for name in names:
            scene.cronjob(name, HOLD, ttl=f"{TTL}s")
        before = reinjected(scene, names, PREVIOUS_IMAGES[1], stamped=False)

        # The previous release guards: runs hold, contenders skip.
        hold(scene, early, "a")
        skips = contend(scene, early, "b")

        # Upgrade while they hold.
        started = time.monotonic()
        upgraded_at = time.time()
        upgraded = run_shell(upgrade_block(release, namespace), paper_env(controlplane), ROOT, 300)
        report["upgrade_s"] = round(time.monotonic() - started, 1)
        after_upgrade = reinjected(scene, names, SIDECAR_IMAGE, stamped=True)
        # The block's own checks: each guarded CronJob's Injected Event, and its status row.
        for name in names:
            assert re.search(rf"(?m)\bInjected\b.*cronjob/{name}\b", upgraded), upgraded
            assert re.search(rf"(?m)^{namespace} +{name} +{name} ", upgraded), upgraded
        report["upgrade_writes"] = sum(after_upgrade[n] - before[n] for n in names)
        report["reinjected_by_upgrade"] = sum(after_upgrade[n] > before[n] for n in names)
        leases_renewed_since(scene, early, upgraded_at)  # old sidecars, new operator
        hold(scene, late, "c")  # new sidecars
        skips += contend(scene, early, "d")  # new sidecars against old holders

        # Roll back while both hold.
        started = time.monotonic()
        rolled_back_at = time.time()
        run_shell(rollback_block(release, namespace), paper_env(controlplane), ROOT, 300)
        report["rollback_s"] = round(time.monotonic() - started, 1)
        after_rollback = reinjected(scene, names, PREVIOUS_IMAGES[1], stamped=False)
        report["rollback_writes"] = sum(after_rollback[n] - after_upgrade[n] for n in names)
        report["reinjected_by_rollback"] = sum(after_rollback[n] > after_upgrade[n] for n in names)
        leases_renewed_since(scene, names, rolled_back_at)  # both, under the old operator
        skips += contend(scene, names, "e")  # old sidecars against old and new holders
    finally:
        watch.stop()
        helm(controlplane, "uninstall", release, "-n", namespace, "--wait", check=False)

    works = {name: scene.works(name) for name in names}
    report["overlaps"] = sum(len(overlapping(w)) for w in works.values())
    report["runs"] = sum(len(w) for w in works.values())
    report["contenders"] = len(skips)
    report["not_skipped"] = [code for code in skips if code != EXIT_SKIPPED]
    report["holders_stopped"] = sum(not w.running for ws in works.values() for w in ws)
    report["skew_events"] = sum(len(scene.events(name, "SidecarVersionSkew")) for name in names)
    gaps = renewal_gaps(watch)
    report["renewals_missed"] = sum(
        int(gap // RENEW) - 1 for each in gaps.values() for gap in each if gap > 2 * RENEW
    )
    report["longest_renewal_gap_s"] = round(
        max((max(g, default=0) for g in gaps.values()), default=0), 1
    )
    print("upgrade drill:", json.dumps(report))

    assert report["overlaps"] == 0, works
    # Only the holders worked: every contender skipped at its gate, under either release.
    assert report["runs"] == len(early) + len(late), works
    assert report["not_skipped"] == [], report
    # No holder was stopped by either change: each still works, holding its lock.
    assert report["holders_stopped"] == 0, works
    # The two releases are within the supported skew: no SidecarVersionSkew Event.
    assert report["skew_events"] == 0, report
    # Each release re-injected every CronJob, once.
    assert report["reinjected_by_upgrade"] == CRONJOBS, report
    assert report["reinjected_by_rollback"] == CRONJOBS, report
    assert report["upgrade_writes"] == CRONJOBS, report
    assert report["rollback_writes"] == CRONJOBS, report
    # No holder went unrenewed for its Lease's duration: none lost its lock to the change.
    assert report["longest_renewal_gap_s"] < TTL, gaps
    assert report["renewals_missed"] == 0, gaps
