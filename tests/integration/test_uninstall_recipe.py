"""docs/INSTALL.md's uninstall recipe, run line for line from the paper against the real API
server and a release `helm install` made of the real chart: a CronJob annotated "true", one
annotated "false" in a labelled namespace, and one guarded by its namespace's label alone.
After the recipe (its `helm uninstall` included) none is injected, the opted-out one was
never written to, and the recipe's last command says `0 injected CronJobs`.

The operator runs as a process with the release's own ServiceAccount token and its
Deployment's environment (the chart's pod never runs: this ring has no node)."""

from __future__ import annotations

import copy
import secrets
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from tests.support import gen
from tests.support.controlplane import ControlPlane
from tests.support.kube import run_tool, wait_for
from tests.support.objects import batch, comparable, has_sidecar, read
from tests.support.operator import CHART, SIDECAR_VALUES, start_release_operator
from tests.support.papers import marked_block, run_shell
from tests.support.paths import ROOT

INSTALL_MD = ROOT / "docs" / "INSTALL.md"
ENABLED = "cronlock.io/enabled"
# The recipe's release and namespace, as INSTALL.md installs it.
RELEASE, RELEASE_NAMESPACE = "cronlock", "cronlock-system"


def injected_anywhere(api: kubernetes.client.ApiClient) -> list[str]:
    """Every injected CronJob of the cluster, as namespace/name."""
    cronjobs = api.sanitize_for_serialization(batch(api).list_cron_job_for_all_namespaces())
    return [
        f"{item['metadata']['namespace']}/{item['metadata']['name']}"
        for item in cronjobs["items"]
        if has_sidecar(item)
    ]


def as_written_without_opt_in(stored: dict[str, Any]) -> dict[str, Any]:
    """A CronJob as its user wrote it, once the recipe took its annotation "true" away."""
    result = copy.deepcopy(stored)
    annotations = result["metadata"].get("annotations") or {}
    annotations.pop(ENABLED, None)
    if not annotations:
        result["metadata"].pop("annotations", None)
    return result


@pytest.mark.timeout(600)  # the recipe waits up to 300 s for the reverts
def test_the_documented_uninstall_leaves_no_cronjob_injected(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    tmp_path: Path,
) -> None:
    core = kubernetes.client.CoreV1Api(api)
    annotated_only, labelled = namespace, f"labelled-{secrets.token_hex(3)}"
    # The release's own namespace, standing for the recipe's cronlock-system (which the
    # recipe deletes; the ring's operator RBAC lives in the real one).
    release_namespace = f"cl-system-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": labelled}})
    try:
        # Leftovers of earlier tests (namespaces still being deleted) would be counted by
        # the recipe's cluster-wide check: wait until this test's are the only ones.
        wait_for(lambda: not injected_anywhere(api), 120, "no injected CronJob in the cluster yet")
        create = batch(api).create_namespaced_cron_job
        create(annotated_only, gen.cronjob("report", gen.in_namespace(None)))
        create(labelled, gen.cronjob("own", gen.in_namespace(None)))
        create(
            labelled,
            gen.cronjob("out", gen.in_namespace(None), gen.with_annotations({ENABLED: "false"})),
        )
        # Enrolled by the label alone: with an account of its own, as the label guards no
        # CronJob whose pods run as `default` (docs/USAGE.md, N4).
        core.create_namespaced_service_account(labelled, {"metadata": {"name": "plain-runner"}})
        create(
            labelled,
            gen.cronjob(
                "plain",
                gen.in_namespace(None),
                gen.not_opted_in(),
                gen.service_account("plain-runner"),
            ),
        )
        written = {
            (space, name): comparable(read(api, space, name))
            for space, name in (
                (annotated_only, "report"),
                (labelled, "own"),
                (labelled, "out"),
                (labelled, "plain"),
            )
        }
        core.patch_namespace(labelled, {"metadata": {"labels": {ENABLED: "true"}}})

        run_tool(
            controlplane.env, "helm", "install", RELEASE, str(CHART), "-n", release_namespace,
            "--create-namespace", "--wait=false",
            "--set", f"watchNamespaces={{{annotated_only},{labelled}}}",
            *(arg for value in SIDECAR_VALUES for arg in ("--set", value)),
            timeout=120, cwd=ROOT,
        )  # fmt: skip
        operator = start_release_operator(api, controlplane, release_namespace, RELEASE, tmp_path)
        try:
            for space, name in ((annotated_only, "report"), (labelled, "own"), (labelled, "plain")):
                wait_for(
                    lambda s=space, n=name: has_sidecar(read(api, s, n)), 60, f"{name} injected"
                )
            assert sorted(injected_anywhere(api)) == sorted(
                [f"{annotated_only}/report", f"{labelled}/own", f"{labelled}/plain"]
            )
            recipe = marked_block(INSTALL_MD, "uninstall").replace(
                RELEASE_NAMESPACE, release_namespace
            )
            assert recipe != marked_block(INSTALL_MD, "uninstall"), "names no namespace"
            output = run_shell(recipe, controlplane.env, tmp_path, timeout=420)
        finally:
            operator.stop()

        shown = f"{output}\n{operator.log()[-3000:]}"
        assert output.rstrip().splitlines()[-1] == "0 injected CronJobs", shown
        assert injected_anywhere(api) == [], shown
        # Each as written, but for the annotation "true" the recipe removed; the opted-out
        # one never written to, its "false" kept for a later install.
        for (space, name), stored in written.items():
            now = comparable(read(api, space, name))
            expected = stored if name == "out" else as_written_without_opt_in(stored)
            assert now == expected, f"{space}/{name}\n{shown}"
        assert ENABLED not in (core.read_namespace(labelled).metadata.labels or {})
        released = run_tool(controlplane.env, "helm", "list", "-A", "-q", timeout=60).stdout
        assert RELEASE not in released.split(), released
        left = {
            space.metadata.name
            for space in core.list_namespace().items
            if space.status.phase != "Terminating"
        }
        assert release_namespace not in left, "the recipe deletes the release's namespace"
    finally:
        core.delete_namespace(labelled, propagation_policy="Background")
        run_tool(
            controlplane.env, "helm", "uninstall", RELEASE, "-n", release_namespace,
            check=False, timeout=120,
        )  # fmt: skip
