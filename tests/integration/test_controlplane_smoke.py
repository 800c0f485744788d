"""The local control plane is real: Leases, RBAC and the Job controller work.

That its CronJob controller starts Jobs on schedule is shown where a test waits out real
minute ticks anyway: tests/longwatch/test_neighbours.py (a Job of the CronJob's at each
tick of its 5-minute window), and on the node the e2e ring's tick tests."""

from __future__ import annotations

import datetime

import kubernetes
import pytest

from tests.support.controlplane import ControlPlane, ServiceAccountKubeconfig
from tests.support.kube import wait_for


def test_kubectl_shows_the_holder_of_a_lease_written_by_the_python_client(
    controlplane: ControlPlane, api: kubernetes.client.ApiClient, namespace: str
) -> None:
    kubernetes.client.CoordinationV1Api(api).create_namespaced_lease(
        namespace,
        {
            "metadata": {"name": "cronlock-smoke"},
            "spec": {
                "holderIdentity": "smoke-pod_0123abcd",
                "leaseDurationSeconds": 30,
                # The Python client re-serialises MicroTime; a non-zero microsecond keeps its
                # six fractional digits, which the API server requires.
                "renewTime": datetime.datetime(2026, 11, 29, 8, 0, 0, 123456, tzinfo=datetime.UTC),
            },
        },
    )

    table = controlplane.kubectl("get", "lease", "cronlock-smoke", "-n", namespace)

    header, row = table.strip().splitlines()
    assert header.split()[:2] == ["NAME", "HOLDER"]
    assert row.split()[:2] == ["cronlock-smoke", "smoke-pod_0123abcd"]


def test_the_job_controller_creates_a_pod_for_a_job(
    api: kubernetes.client.ApiClient, namespace: str
) -> None:
    kubernetes.client.BatchV1Api(api).create_namespaced_job(
        namespace,
        {
            "metadata": {"name": "smoke"},
            "spec": {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "busybox", "command": ["true"]}],
                    }
                }
            },
        },
    )
    core = kubernetes.client.CoreV1Api(api)

    pods = wait_for(
        lambda: core.list_namespaced_pod(namespace, label_selector="job-name=smoke").items,
        timeout=30,
        what="the Job controller to create a pod",
    )

    assert pods[0].metadata.owner_references[0].kind == "Job"
    assert pods[0].metadata.owner_references[0].name == "smoke"


def test_rbac_denies_a_service_account_what_no_role_grants(
    api: kubernetes.client.ApiClient,
    namespace: str,
    service_account_kubeconfig: ServiceAccountKubeconfig,
    controlplane: ControlPlane,
) -> None:
    as_default = controlplane.api_client(service_account_kubeconfig(namespace, "default"))
    leases = kubernetes.client.CoordinationV1Api(as_default)

    with pytest.raises(kubernetes.client.ApiException) as denied:
        leases.list_namespaced_lease(namespace)

    assert denied.value.status == 403
    # The same identity gains exactly what a Role grants it, and nothing more.
    rbac = kubernetes.client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "lease-reader"},
            "rules": [
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list"]}
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "lease-reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "lease-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}],
        },
    )
    assert wait_for(
        lambda: _can_list(leases, namespace), timeout=10, what="the Role to take effect"
    )
    with pytest.raises(kubernetes.client.ApiException) as still_denied:
        kubernetes.client.CoreV1Api(as_default).list_namespaced_secret(namespace)
    assert still_denied.value.status == 403


def _can_list(leases: kubernetes.client.CoordinationV1Api, namespace: str) -> bool:
    try:
        leases.list_namespaced_lease(namespace)
    except kubernetes.client.ApiException as error:
        if error.status == 403:
            return False
        raise
    return True
