"""Fixtures of the chart's tests: a release installed, a namespace beside the test's."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from tests.integration.chart.harness import CHART, Install, helm, label_restricted, values_file
from tests.support.controlplane import ControlPlane


@pytest.fixture
def install(controlplane: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[Install]:
    """`helm install` into the test's namespace (labelled restricted); uninstalled afterwards."""
    releases: list[str] = []

    def run(values: dict[str, Any] | None = None) -> str:
        label_restricted(controlplane, namespace)
        release = f"cl-{secrets.token_hex(3)}"
        args = ["install", release, str(CHART), "-n", namespace, "--wait=false"]
        if values is not None:
            args += ["-f", values_file(tmp_path, values)]
        result = helm(controlplane, *args)
        releases.append(release)
        assert "kubectl annotate cronjob NAME" in result.stdout  # NOTES.txt
        return release

    yield run
    for release in releases:
        # ClusterRole(Binding)s outlive the namespace; uninstall removes them.
        helm(controlplane, "uninstall", release, "-n", namespace, check=False)


@pytest.fixture
def extra_namespace(api: kubernetes.client.ApiClient) -> Iterator[Callable[[], str]]:
    core = kubernetes.client.CoreV1Api(api)
    made: list[str] = []

    def make() -> str:
        name = f"chart-extra-{secrets.token_hex(3)}"
        core.create_namespace({"metadata": {"name": name}})
        made.append(name)
        return name

    yield make
    for name in made:
        core.delete_namespace(name, propagation_policy="Background")
