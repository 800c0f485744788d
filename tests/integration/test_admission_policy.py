"""The chart's ValidatingAdmissionPolicy, tried with the operator's own token: what its RBAC
allows beyond cronlock's own objects is refused by the API server.

The session's `operator_kubeconfig` installs the chart's RBAC and this policy, so every
other integration and end-to-end test shows the operator's real work passes it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from tests.support.controlplane import ControlPlane
from tests.support.cronjobs import make_cronjob

OURS = {"app.kubernetes.io/managed-by": "cronlock"}


@pytest.fixture
def as_operator(
    controlplane: ControlPlane, operator_kubeconfig: Path
) -> kubernetes.client.ApiClient:
    return controlplane.api_client(operator_kubeconfig)


def refused(call: Callable[[], Any]) -> str:
    with pytest.raises(kubernetes.client.ApiException) as caught:
        call()
    assert caught.value.status in (403, 422), caught.value.body
    return str(caught.value.body)


def test_the_operator_cannot_touch_node_heartbeats_or_system_leases(
    api: kubernetes.client.ApiClient, as_operator: kubernetes.client.ApiClient
) -> None:
    leases = kubernetes.client.CoordinationV1Api(as_operator)
    admin_leases = kubernetes.client.CoordinationV1Api(api)
    node_leases = admin_leases.list_namespaced_lease("kube-node-lease").items
    if node_leases:
        heartbeat = node_leases[0].metadata.name
    else:  # no node registered in this ring: a heartbeat-shaped Lease of its own
        heartbeat = "node-a"
        admin_leases.create_namespaced_lease(
            "kube-node-lease",
            {"metadata": {"name": heartbeat}, "spec": {"holderIdentity": heartbeat}},
        )
    body = refused(
        lambda: leases.patch_namespaced_lease(
            heartbeat, "kube-node-lease", {"spec": {"holderIdentity": "stolen"}}
        )
    )
    assert "never writes in kube-system or kube-node-lease" in body
    refused(
        lambda: leases.create_namespaced_lease(
            "kube-system", {"metadata": {"name": "cronlock-x", "labels": OURS}}
        )
    )


def test_the_operator_cannot_write_leases_it_did_not_make(
    api: kubernetes.client.ApiClient, as_operator: kubernetes.client.ApiClient, namespace: str
) -> None:
    leases = kubernetes.client.CoordinationV1Api(as_operator)
    kubernetes.client.CoordinationV1Api(api).create_namespaced_lease(
        namespace, {"metadata": {"name": "leader"}, "spec": {"holderIdentity": "app-1"}}
    )
    body = refused(
        lambda: leases.patch_namespaced_lease("leader", namespace, {"metadata": {"labels": OURS}})
    )
    assert "only objects labelled app.kubernetes.io/managed-by=cronlock" in body
    refused(lambda: leases.delete_namespaced_lease("leader", namespace))
    refused(lambda: leases.create_namespaced_lease(namespace, {"metadata": {"name": "unlabelled"}}))
    # Its own kind of Lease it may create, change and delete.
    leases.create_namespaced_lease(namespace, {"metadata": {"name": "cronlock-x", "labels": OURS}})
    leases.patch_namespaced_lease("cronlock-x", namespace, {"spec": {"leaseDurationSeconds": 30}})
    leases.delete_namespaced_lease("cronlock-x", namespace)


def test_the_operator_cannot_mint_rbac_for_anyone(
    as_operator: kubernetes.client.ApiClient, namespace: str
) -> None:
    rbac = kubernetes.client.RbacAuthorizationV1Api(as_operator)
    wide_role = {
        "metadata": {"name": "cronlock-holder-ci", "labels": OURS},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
    }
    # RBAC alone refuses what the operator itself lacks; the policy refuses the rest.
    refused(lambda: rbac.create_namespaced_role(namespace, wide_role))
    lease_role = {
        "metadata": {"name": "admin-tools", "labels": OURS},
        "rules": [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]}
        ],
    }
    assert "only holder Roles" in refused(
        lambda: rbac.create_namespaced_role(namespace, lease_role)
    )
    to_cluster_role = {
        "metadata": {"name": "cronlock-holder-ci", "labels": OURS},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "cronlock",
        },
        "subjects": [{"kind": "ServiceAccount", "name": "ci", "namespace": namespace}],
    }
    body = refused(lambda: rbac.create_namespaced_role_binding(namespace, to_cluster_role))
    assert "binds only its holder Role" in body
    # A holder Role and its binding, as the operator writes them, pass.
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "cronlock-holder-ci", "labels": OURS},
            "rules": [
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "resourceNames": ["cronlock-report"],
                    "verbs": ["get", "update", "patch"],
                }
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            **to_cluster_role,
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "cronlock-holder-ci",
            },
        },
    )


def test_the_operators_cronjob_patches_can_neither_switch_account_nor_image_nor_schedule(
    api: kubernetes.client.ApiClient, as_operator: kubernetes.client.ApiClient, namespace: str
) -> None:
    """A stolen operator token may still wrap a job template in cronlock's containers, but
    not run the user's containers as another account or from another image."""
    batch = kubernetes.client.BatchV1Api(as_operator)
    kubernetes.client.BatchV1Api(api).create_namespaced_cron_job(
        namespace,
        make_cronjob(
            name="plain",
            namespace=None,
            schedule="0 0 1 1 *",
            annotations={},
            restart_policy="Never",
        ),
    )
    pod = "/spec/jobTemplate/spec/template/spec"

    def patch(*ops: dict[str, Any]) -> Any:
        return batch.patch_namespaced_cron_job(
            "plain", namespace, list(ops), _content_type="application/json-patch+json"
        )

    body = refused(lambda: patch({"op": "add", "path": f"{pod}/serviceAccountName", "value": "x"}))
    assert "never changes the account" in body
    body = refused(
        lambda: patch({"op": "replace", "path": f"{pod}/containers/0/image", "value": "evil:1"})
    )
    assert "never changes the image of a container it did not add" in body
    body = refused(lambda: patch({"op": "replace", "path": "/spec/schedule", "value": "* * * * *"}))
    assert "changes only a CronJob's job template and its cronlock.io annotations" in body
    refused(
        lambda: patch({"op": "add", "path": "/metadata/annotations", "value": {"team": "evil"}})
    )
    # What injection does stays possible: its own containers, its own annotations.
    sidecar = {"name": "cronlock", "image": "cronlock:any", "restartPolicy": "Always"}
    patch(
        {"op": "add", "path": f"{pod}/initContainers", "value": [sidecar]},
        {"op": "add", "path": "/metadata/annotations", "value": {"cronlock.io/x": "1"}},
    )
