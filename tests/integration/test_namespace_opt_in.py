"""Namespace opt-in on the real API server, the operator running as the chart's
ServiceAccount with exactly the chart's RBAC: the label cronlock.io/enabled=true on a
namespace guards every CronJob in it but one annotated "false"; removed, it gives each back
exactly as written. The label added and removed while the CronJobs exist, a CronJob
created while it is there, an operator restarted while it is there (no revert at start),
and what the operator's own token may do with namespaces (read, never write)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from tests.support.controlplane import ControlPlane
from tests.support.cronjobs import make_cronjob
from tests.support.kube import wait_for
from tests.support.objects import batch, comparable, has_sidecar, read
from tests.support.operator import OperatorProcess

pytestmark = pytest.mark.usefixtures("operator")
LABEL = "cronlock.io/enabled"
BIN = Path(__file__).resolve().parents[2] / ".venv" / "bin"


def label(api: kubernetes.client.ApiClient, namespace: str, value: str | None) -> None:
    kubernetes.client.CoreV1Api(api).patch_namespace(
        namespace, {"metadata": {"labels": {LABEL: value}}}
    )


def create(api: kubernetes.client.ApiClient, namespace: str, name: str, **notes: str) -> None:
    body = make_cronjob(name=name, namespace=namespace, annotations=notes, restart_policy="Never")
    batch(api).create_namespaced_cron_job(namespace, body)


def wait_injected(api: kubernetes.client.ApiClient, namespace: str, *names: str) -> None:
    for name in names:
        wait_for(lambda n=name: has_sidecar(read(api, namespace, n)), 30, f"{name} injected")


def test_the_label_guards_a_namespaces_cronjobs_and_removed_gives_them_back(
    api: kubernetes.client.ApiClient, namespace: str, controlplane: ControlPlane
) -> None:
    create(api, namespace, "own", **{LABEL: "true"})
    create(api, namespace, "plain")
    create(api, namespace, "out", **{LABEL: "false"})
    wait_injected(api, namespace, "own")
    written = {name: comparable(read(api, namespace, name)) for name in ("plain", "out")}
    assert not has_sidecar(read(api, namespace, "plain")), "no label yet: not guarded"

    label(api, namespace, "true")
    wait_injected(api, namespace, "plain")
    create(api, namespace, "late")  # while the label is there
    wait_injected(api, namespace, "late")
    leases = kubernetes.client.CoordinationV1Api(api).list_namespaced_lease(namespace).items
    assert {lease.metadata.name for lease in leases} == {
        "cronlock-own",
        "cronlock-plain",
        "cronlock-late",
    }
    # The one annotated "false" opted out: never written to.
    assert comparable(read(api, namespace, "out")) == written["out"]

    # cronlock status shows which rule guards each (the admin may read namespaces).
    shown = subprocess.run(
        [str(BIN / "cronlock"), "status", "-n", namespace, "-o", "json"],
        env=controlplane.env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    guarded = {item["cronjob"]: item["guardedBy"] for item in json.loads(shown.stdout)["items"]}
    assert guarded == {"own": "annotation", "plain": "namespace", "late": "namespace"}

    label(api, namespace, None)
    wait_for(
        lambda: comparable(read(api, namespace, "plain")) == written["plain"],
        30,
        "plain reverted exactly as written",
    )
    wait_for(lambda: not has_sidecar(read(api, namespace, "late")), 30, "late reverted")
    assert has_sidecar(read(api, namespace, "own")), "its own annotation still guards it"
    assert comparable(read(api, namespace, "out")) == written["out"]


def test_an_operator_started_while_a_namespace_is_labelled_reverts_nothing(
    api: kubernetes.client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """A restart neither reverts a CronJob its namespace guards nor writes it at all: the
    namespace watch is registered at every start, and the labels are read before the first
    CronJob is decided (that order, which the watches' own timing mostly hides, is kept by
    tests/unit/operator/test_runtime.py)."""
    label(api, namespace, "true")
    create(api, namespace, "plain")
    wait_injected(api, namespace, "plain")
    version = read(api, namespace, "plain")["metadata"]["resourceVersion"]
    operator.restart()
    create(api, namespace, "after")  # decided only once the restarted operator runs
    wait_injected(api, namespace, "after")
    time.sleep(2)  # its first pass over every CronJob is done by now, and more
    assert read(api, namespace, "plain")["metadata"]["resourceVersion"] == version


def test_the_operators_token_reads_namespaces_and_writes_none(
    controlplane: ControlPlane, operator_kubeconfig: Path, namespace: str
) -> None:
    """What the chart grants for namespace opt-in: get, list and watch; the label is the
    cluster admin's to set, never the operator's."""
    core = kubernetes.client.CoreV1Api(controlplane.api_client(operator_kubeconfig))
    core.read_namespace(namespace)
    listed = core.list_namespace(label_selector=f"{LABEL}=true").items
    assert all(item.metadata.labels.get(LABEL) == "true" for item in listed)
    patches: list[dict[str, Any]] = [
        {"metadata": {"labels": {LABEL: "true"}}},
        {"metadata": {"annotations": {"x": "y"}}},
    ]
    for patch in patches:
        with pytest.raises(kubernetes.client.ApiException) as refused:
            core.patch_namespace(namespace, patch)
        assert refused.value.status == 403
    with pytest.raises(kubernetes.client.ApiException) as refused:
        core.delete_namespace(namespace)
    assert refused.value.status == 403


def test_an_operator_watching_named_namespaces_follows_their_labels_alone(
    api: kubernetes.client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """With `--namespace` (the chart's watchNamespaces) kopf watches CronJobs per
    namespace, and namespaces, cluster-scoped, still through the one label-selected watch:
    a labelled namespace it does not watch changes nothing."""
    other = f"{namespace[:50]}-x"
    kubernetes.client.CoreV1Api(api).create_namespace({"metadata": {"name": other}})
    try:
        operator.args = ["--namespace", namespace]
        operator.restart()
        create(api, namespace, "plain")
        create(api, other, "plain")
        label(api, namespace, "true")
        label(api, other, "true")
        wait_injected(api, namespace, "plain")
        create(api, namespace, "own", **{LABEL: "true"})
        wait_injected(api, namespace, "own")  # by now the other namespace was seen too
        assert not has_sidecar(read(api, other, "plain"))
    finally:
        operator.args = []
        operator.restart()
        kubernetes.client.CoreV1Api(api).delete_namespace(other)
