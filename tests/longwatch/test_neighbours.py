"""Beside another admission controller that changes CronJob templates, on the real API server:
a Kyverno-like MutatingAdmissionPolicy gives every container of every CronJob template a
label and each request and limit it lacks, cronlock's own containers too (cronlock sets no
CPU limit by default, so the policy adds one). The operator injects once and then leaves
the CronJob alone: it does not write its own template back over the policy's additions (each
such patch would come back from admission unchanged, one per watch event, the CronJob
controller's status writes included), and says once, in an Event, what admission changed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
import yaml

from tests.support import gen, neighbours
from tests.support.controlplane import ControlPlane
from tests.support.kube import wait_for
from tests.support.objects import (
    Versions,
    comparable,
    cronjob_editor,
    events,
    read,
    wait_event,
)

pytestmark = pytest.mark.usefixtures("operator")
REASON = "ChangedByAdmission"

# How long the operator is watched not writing: the 5 minutes, over which the
# operator's periodic passes (its resync of every guarded CronJob) run several times.
WINDOW = 300.0


def guarded(namespace: str, schedule: str) -> dict[str, Any]:
    """CronJob `report`, opted in, as its user writes it."""
    return gen.cronjob(
        "report",
        gen.in_namespace(namespace),
        gen.with_schedule(schedule),
        gen.restart_policy("Never"),
    )


def pod_spec(cronjob: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return spec


def containers(cronjob: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = pod_spec(cronjob)
    return {c["name"]: c for c in [*spec.get("initContainers", []), *spec["containers"]]}


@pytest.fixture
def defaults_policy(controlplane: ControlPlane, namespace: str) -> Iterator[str]:
    """The Kyverno-like policy, bound to the test's namespace; deleted afterwards."""
    text = yaml.safe_dump_all(neighbours.defaults(namespace))
    controlplane.kubectl("apply", "-f", "-", input_text=text)
    probe = yaml.safe_dump(gen.cronjob("probe", gen.in_namespace(namespace), gen.never_due()))

    def taken_up() -> bool:
        out = controlplane.kubectl(
            "create", "--dry-run=server", "-o", "yaml", "-f", "-", input_text=probe
        )
        return neighbours.LABEL in out

    wait_for(taken_up, 30, "the API server to take up the policy")
    yield text
    controlplane.kubectl("delete", "-f", "-", "--ignore-not-found", input_text=text)


@pytest.mark.timeout(WINDOW + 120)
def test_the_operator_leaves_what_a_mutating_neighbour_adds_and_writes_nothing_for_5_minutes(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    defaults_policy: str,
) -> None:
    # Every minute: the CronJob controller's Jobs and status writes are watch events the
    # operator reconciles on, each a chance to fight.
    body = guarded(namespace, "* * * * *")
    kubernetes.client.BatchV1Api(api).create_namespaced_cron_job(namespace, body)
    written = read(api, namespace, "report")
    assert containers(written)["main"]["resources"]["limits"]["cpu"] == "250m", "policy applied"
    versions = Versions(api, namespace, written["metadata"]["resourceVersion"])

    first = wait_for(
        lambda: next((v for v in versions.seen if "cronlock" in containers(v)), None),
        30,
        "the operator's injection",
    )
    # The injection passed through the policy too: cronlock's containers got the CPU limit
    # cronlock does not set, the template its label, and the user's container kept its own.
    injected = containers(first)
    for name in ("cronlock", "cronlock-gate"):
        assert injected[name]["resources"]["limits"]["cpu"] == "250m", injected[name]
        assert injected[name]["resources"]["requests"]["cpu"] == "10m", "cronlock's own stays"
    labels = first["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    assert labels[neighbours.LABEL] == "batch"
    # The operator says so, once, as a Normal Event: more resources leave the lock working.
    [message] = wait_event(api, namespace, "report", REASON)
    assert "initContainers[cronlock].resources.limits.cpu" in message, message
    said = [kind for kind, reason, _ in events(api, namespace, "report") if reason == REASON]
    assert said == ["Normal"]

    patches = cronjob_patches(controlplane)
    time.sleep(WINDOW)
    patched = cronjob_patches(controlplane) - patches
    seen = versions.stop()
    after = [v for v in seen[seen.index(first) + 1 :] if comparable(v) != comparable(first)]
    since = max(entry.get("time", "") for entry in first["metadata"]["managedFields"])
    writers = sorted(
        {
            entry.get("manager", "?")
            for version in after
            for entry in version["metadata"].get("managedFields") or []
            if entry.get("time", "") > since
        }
    )
    assert after == [], (
        f"{len(after)} writes to the CronJob in {WINDOW:.0f}s after the injection "
        f"(managers: {writers})"
    )
    # Not even a write the API server found changed nothing (a patch admission turned back
    # into what was stored): only the operator patches CronJobs here.
    assert patched == 0, f"{patched} PATCH requests for CronJobs in {WINDOW:.0f}s"
    ticks = [v for v in seen if v["status"].get("lastScheduleTime")]
    assert ticks, "the CronJob ticked in the window: the operator had events to react to"
    # The CronJob controller started a Job of the CronJob's at its ticks (the control plane
    # is real: no test waits out a minute tick for this alone).
    jobs = kubernetes.client.BatchV1Api(api).list_namespaced_job(namespace).items
    owners = [ref for job in jobs for ref in job.metadata.owner_references or []]
    assert any(ref.kind == "CronJob" and ref.name == "report" for ref in owners), jobs
    assert "cronlock" in containers(read(api, namespace, "report"))
    assert len(wait_event(api, namespace, "report", REASON)) == 1


def cronjob_patches(controlplane: ControlPlane) -> int:
    """PATCH requests for CronJobs the API server answered so far (its own count)."""
    total = 0
    for line in controlplane.kubectl("get", "--raw", "/metrics").splitlines():
        if line.startswith("apiserver_request_total{") and all(
            label in line for label in ('resource="cronjobs"', 'verb="PATCH"', 'subresource=""')
        ):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def test_a_cronjob_editor_cannot_keep_a_sidecar_she_changed_behind_the_admitted_form(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    defaults_policy: str,
    service_account_kubeconfig: Any,
) -> None:
    """The operator stops writing only while the CronJob is exactly what admission made of
    its own patch: her image for cronlock's sidecar (one that would fake the lock) makes a
    different template, injected over."""
    as_mallory = cronjob_editor(api, namespace, service_account_kubeconfig, controlplane, "report")
    as_mallory.create_namespaced_cron_job(namespace, guarded(namespace, "0 0 1 1 *"))
    wait_event(api, namespace, "report", REASON)  # the admitted form is remembered
    injected = read(api, namespace, "report")
    image = containers(injected)["cronlock"]["image"]
    index = [c["name"] for c in pod_spec(injected)["initContainers"]].index("cronlock")

    as_mallory.patch_namespaced_cron_job(
        "report",
        namespace,
        [
            {
                "op": "replace",
                "path": f"/spec/jobTemplate/spec/template/spec/initContainers/{index}/image",
                "value": "registry.example/fake-lock:1",
            }
        ],
    )
    restored = wait_for(
        lambda: (c if containers(c := read(api, namespace, "report"))["cronlock"]["image"]
                 == image else None),
        30,
        "the operator to put cronlock's sidecar back",
    )  # fmt: skip
    assert containers(restored)["cronlock"]["resources"]["limits"]["cpu"] == "250m"


def test_the_three_neighbours_act_on_a_pod_as_the_node_tests_expect(
    controlplane: ControlPlane, namespace: str
) -> None:
    """The policies tests/e2e/test_neighbours_on_node.py runs beside: on a server-side dry
    run of a restricted pod, each one's change is there and Pod Security admits the result."""
    uid = 1000650000
    text = yaml.safe_dump_all(
        [
            *neighbours.defaults(namespace),
            *neighbours.injector(namespace),
            *neighbours.arbitrary_uids(namespace, uid),
        ]
    )
    controlplane.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    controlplane.kubectl("apply", "-f", "-", input_text=text)
    pod = yaml.safe_dump(neighbours.restricted_pod(namespace, "probe"))
    answers: list[str] = []
    try:

        def admitted() -> dict[str, Any] | None:
            out = controlplane.kubectl(
                "create", "--dry-run=server", "-o", "yaml", "-f", "-", input_text=pod, check=False
            )
            answers.append(out)
            body = yaml.safe_load(out) if out.startswith("apiVersion") else None
            return body if body is not None and all_three_marks(body) else None

        def all_three_marks(body: dict[str, Any]) -> bool:
            # The API server takes up each policy on its own; wait for every one's mark
            # (the label, the injected container, the UID on every container).
            spec = body.get("spec", {})
            every = [*spec.get("initContainers", []), *spec.get("containers", [])]
            return (
                neighbours.LABEL in body["metadata"].get("labels", {})
                and neighbours.INJECTED in [c["name"] for c in every]
                and all("runAsUser" in c.get("securityContext", {}) for c in every)
            )

        try:
            body = wait_for(admitted, 30, "the API server to take up the three policies")
        except AssertionError as error:
            raise AssertionError(f"{error}; its last answer: {answers[-1:]}") from None
    finally:
        controlplane.kubectl("delete", "-f", "-", "--ignore-not-found", input_text=text)
    assert body["metadata"]["labels"][neighbours.LABEL] == "batch"
    every = [*body["spec"]["initContainers"], *body["spec"]["containers"]]
    assert [c["name"] for c in every] == [neighbours.INJECTED, "probe"]
    assert {c["securityContext"]["runAsUser"] for c in every} == {uid}
    assert {c["securityContext"]["runAsGroup"] for c in every} == {0}
    for container in every:
        assert set(container["resources"]["limits"]) == {"cpu", "memory"}, container
        assert set(container["resources"]["requests"]) == {"cpu", "memory"}, container
    # The injector's own amounts stay; only the CPU limit it lacked was added.
    agent = body["spec"]["initContainers"][0]
    assert agent["resources"]["requests"]["cpu"] == "5m"
    assert agent["resources"]["limits"]["cpu"] == neighbours.DEFAULT_LIMITS["cpu"]
