"""An operator told to leave the injected UID unset and to give a CPU limit, on a real API
server with the chart's RBAC and admission policies: what it writes is admitted, under
`restricted` Pod Security and a ResourceQuota on limits.cpu, and new settings re-inject."""

from __future__ import annotations

import copy
import json
import secrets
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from cronlock_operator.cronjob.config import parse_config
from cronlock_operator.injection.build import build_injection
from cronlock_operator.injection.patching import injection_patch
from cronlock_operator.settings import OperatorSettings
from tests.support import gen
from tests.support.controlplane import ControlPlane
from tests.support.cronjobs import pod_spec
from tests.support.kube import holds, wait_for
from tests.support.objects import annotate, comparable, read
from tests.support.operator import SIDECAR_IMAGE, OperatorProcess, operator_caught_up

OPENSHIFT_ARGS = (
    *("--sidecar-run-as-user", ""),
    *("--sidecar-run-as-group", ""),
    *("--sidecar-cpu-limit", "100m"),
    # The API server stores it as 128Mi: no difference, so no patch after patch.
    *("--sidecar-memory-limit", "0.125Gi"),
)
RESTRICTED_CONTAINER = {
    "name": "main",
    "image": "busybox:1.36",
    "command": ["true"],
    "securityContext": {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    "resources": {"limits": {"cpu": "200m", "memory": "64Mi"}},
}
RESTRICTED_SECURITY = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


@pytest.fixture
def guarded_namespace(
    controlplane: ControlPlane, api: kubernetes.client.ApiClient, namespace: str
) -> str:
    """The test's namespace enforcing `restricted`, with a quota on limits.cpu and no
    LimitRange: a pod with a container without a CPU limit is refused."""
    controlplane.kubectl(
        "label",
        "namespace",
        namespace,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/warn=restricted",
    )
    core = kubernetes.client.CoreV1Api(api)
    hard = {"limits.cpu": "2", "limits.memory": "1Gi"}
    core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "compute"}, "spec": {"hard": hard}}
    )
    # Quota admission enforces a quota once the resource quota controller has given it a
    # status.
    wait_for(
        lambda: core.read_namespaced_resource_quota("compute", namespace).status.hard or None,
        60,
        "the resource quota controller to count the quota",
    )
    return namespace


@pytest.fixture
def openshift_operator(
    controlplane: ControlPlane, operator_kubeconfig: Path, tmp_path: Path
) -> OperatorProcess:
    return OperatorProcess(
        operator_kubeconfig, tmp_path / "operator.log", controlplane.env, list(OPENSHIFT_ARGS)
    )


def dry_run_pod(controlplane: ControlPlane, namespace: str, cronjob: dict[str, Any]) -> str:
    """A Pod of the CronJob's template, created with a server-side dry run: PodSecurity and
    ResourceQuota admit or refuse it as they would the Job's pod. Returns kubectl's output."""
    template = cronjob["spec"]["jobTemplate"]["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"dry-run-{secrets.token_hex(3)}", "namespace": namespace},
        "spec": template["spec"],
    }
    return controlplane.kubectl(
        "create",
        "--dry-run=server",
        "-n",
        namespace,
        "-f",
        "-",
        input_text=json.dumps(pod),
        check=False,
    )


def injected_containers(cronjob: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        c for c in pod_spec(cronjob).get("initContainers") or [] if c["name"].startswith("cronlock")
    ]


def injected_with(
    api: kubernetes.client.ApiClient, namespace: str, run_as_user: int | None
) -> dict[str, Any] | None:
    cronjob = read(api, namespace, "report")
    containers = injected_containers(cronjob)
    if len(containers) != 2:
        return None
    if any(
        c["securityContext"].get("runAsUser") != run_as_user
        for c in containers
        if c["name"] == "cronlock-gate"
    ):
        return None
    return cronjob


def test_unset_uid_and_a_cpu_limit_are_injected_and_admitted_then_reverted(
    api: kubernetes.client.ApiClient,
    controlplane: ControlPlane,
    guarded_namespace: str,
    openshift_operator: OperatorProcess,
    operator_kubeconfig: Path,
    tmp_path: Path,
) -> None:
    namespace = guarded_namespace
    kubernetes.client.BatchV1Api(api).create_namespaced_cron_job(
        namespace,
        gen.cronjob(
            "report",
            *gen.BY_HAND,
            gen.containers(copy.deepcopy(RESTRICTED_CONTAINER)),
            gen.with_pod(terminationGracePeriodSeconds=5),
        ),
    )
    written = comparable(read(api, namespace, "report"))

    # What the old, fixed injection writes: the quota refuses its pods (no CPU limit).
    defaults = OperatorSettings(sidecar_image=SIDECAR_IMAGE)
    old = build_injection(written, parse_config(written, defaults), defaults)
    assert "must specify limits.cpu" in dry_run_pod(controlplane, namespace, old)

    openshift_operator.start()
    try:
        cronjob = wait_for(
            lambda: injected_with(api, namespace, None), timeout=30, what="the injection"
        )
        operator_caught_up(api)
        version = cronjob["metadata"]["resourceVersion"]
        holds(
            lambda: read(api, namespace, "report")["metadata"]["resourceVersion"] == version,
            3,
            "nothing written after the first patch",
        )
        settled = read(api, namespace, "report")
    finally:
        openshift_operator.stop()
    # Exactly the configured values, and nothing written after the first patch.
    assert settled["metadata"]["resourceVersion"] == cronjob["metadata"]["resourceVersion"]
    for container in injected_containers(settled):
        assert container["securityContext"] == RESTRICTED_SECURITY, container["name"]
        assert container["resources"] == {
            "requests": {"cpu": "10m", "memory": "32Mi"},
            "limits": {"cpu": "100m", "memory": "128Mi"},
        }, container["name"]
    output = dry_run_pod(controlplane, namespace, settled)
    assert "created (server dry run)" in output, output

    # Back to the chart's defaults: the same CronJob is re-injected with them.
    operator = OperatorProcess(operator_kubeconfig, tmp_path / "default.log", controlplane.env)
    operator.start()
    try:
        reinjected = wait_for(
            lambda: injected_with(api, namespace, 65532), timeout=30, what="the re-injection"
        )
        for container in injected_containers(reinjected):
            assert container["resources"] == {
                "requests": {"cpu": "10m", "memory": "32Mi"},
                "limits": {"memory": "64Mi"},
            }
            assert container["securityContext"]["runAsGroup"] == 65532
        annotate(api, namespace, "report", enabled="false")
        wait_for(
            lambda: not injected_containers(read(api, namespace, "report")),
            timeout=30,
            what="the revert",
        )
    finally:
        operator.stop()
    reverted = comparable(read(api, namespace, "report"))
    written["metadata"]["annotations"]["cronlock.io/enabled"] = "false"
    assert reverted == written


@pytest.mark.parametrize(
    ("security", "said"),
    [
        ({"runAsUser": 0}, "restricted security"),
        ({"runAsGroup": 0}, "restricted security"),
        ({"allowPrivilegeEscalation": True}, "restricted security"),
        ({"runAsNonRoot": False}, "restricted security"),
        ({"capabilities": {"drop": ["ALL"], "add": ["KILL"]}}, "restricted security"),
    ],
)
def test_the_policy_still_refuses_a_root_or_privileged_injection(
    api: kubernetes.client.ApiClient,
    controlplane: ControlPlane,
    operator_kubeconfig: Path,
    namespace: str,
    security: dict[str, Any],
    said: str,
) -> None:
    """The policy admits the unset ids (above); with the operator's token, an injection that
    sets root or privilege in cronlock's own containers is refused as before."""
    batch = kubernetes.client.BatchV1Api(api)
    batch.create_namespaced_cron_job(namespace, gen.cronjob("report", *gen.BY_HAND))
    stored = read(api, namespace, "report")
    settings = OperatorSettings(
        sidecar_image=SIDECAR_IMAGE, sidecar_run_as_user=None, sidecar_run_as_group=None
    )
    desired = build_injection(stored, parse_config(stored, settings), settings)
    injected_containers(desired)[0]["securityContext"].update(security)
    as_operator = controlplane.api_client(operator_kubeconfig)
    with pytest.raises(kubernetes.client.ApiException) as caught:
        patch(as_operator, namespace, stored, desired)
    assert caught.value.status == 403, caught.value.body
    assert said in str(caught.value.body)
    # The same injection without the change is admitted.
    admitted = build_injection(stored, parse_config(stored, settings), settings)
    patch(as_operator, namespace, stored, admitted)


def patch(
    client: kubernetes.client.ApiClient,
    namespace: str,
    stored: dict[str, Any],
    desired: dict[str, Any],
) -> None:
    """The operator's own JSON patch from `stored` to `desired`, as a server-side dry run."""
    kubernetes.client.BatchV1Api(client).patch_namespaced_cron_job(
        "report",
        namespace,
        injection_patch(stored, desired),
        _content_type="application/json-patch+json",
        dry_run="All",
    )
