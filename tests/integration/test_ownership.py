"""cronlock touches only what it made: a Lease, Role or RoleBinding of the same name that it
did not make is left exactly as it is, and the CronJob that needed it gets a Warning."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes
import pytest

from tests.support import gen
from tests.support.kube import holds, wait_for
from tests.support.objects import annotate, events, injected, wait_event
from tests.support.operator import OperatorProcess, operator_caught_up

pytestmark = pytest.mark.usefixtures("operator")


def stored(raw: Any, api: kubernetes.client.ApiClient) -> dict[str, Any]:
    result: dict[str, Any] = api.sanitize_for_serialization(raw)
    result["metadata"].pop("managedFields", None)
    return result


def test_a_foreign_lease_with_the_locks_name_is_neither_adopted_nor_changed(
    api: kubernetes.client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    leases = kubernetes.client.CoordinationV1Api(api)
    batch = kubernetes.client.BatchV1Api(api)
    foreign = leases.create_namespaced_lease(
        namespace,
        {
            "metadata": {"name": "cronlock-billing", "labels": {"team": "payments"}},
            "spec": {"holderIdentity": "payments-leader", "leaseDurationSeconds": 15},
        },
    )
    before = stored(foreign, api)
    batch.create_namespaced_cron_job(
        namespace,
        gen.cronjob("report", *gen.BY_HAND, gen.annotated({"cronlock.io/lock": "billing"})),
    )

    [message] = wait_event(api, namespace, "report", "Conflict")
    assert f"lease {namespace}/cronlock-billing exists and lacks the label" in message
    assert "cronlock.io/lock" in message
    operator_caught_up(api)
    holds(
        lambda: (
            not injected(api, namespace, "report")
            and stored(leases.read_namespaced_lease("cronlock-billing", namespace), api) == before
        ),
        2,
        "the CronJob stays uninjected and the foreign Lease unchanged",
    )
    role = "cronlock-holder-default"
    rbac = kubernetes.client.RbacAuthorizationV1Api(api)
    granted = [
        name
        for item in rbac.list_namespaced_role(namespace).items
        if item.metadata.name == role
        for rule in item.rules
        for name in rule.resource_names or []
    ]
    assert "cronlock-billing" not in granted, "pods were granted the foreign Lease"

    # Once the name is free, the next change to the CronJob guards it.
    leases.delete_namespaced_lease("cronlock-billing", namespace)
    annotate(api, namespace, "report", ttl="60s")
    wait_for(lambda: injected(api, namespace, "report"), 30, "the CronJob to be injected")
    assert len([r for _, r, _ in events(api, namespace, "report") if r == "Conflict"]) == 1


def test_an_admins_role_with_the_holder_roles_name_is_left_alone_and_only_its_account_waits(
    api: kubernetes.client.ApiClient, namespace: str
) -> None:
    rbac = kubernetes.client.RbacAuthorizationV1Api(api)
    batch = kubernetes.client.BatchV1Api(api)
    admins = rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "cronlock-holder-default"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
        },
    )
    before = stored(admins, api)
    batch.create_namespaced_cron_job(namespace, gen.cronjob("report", *gen.BY_HAND))
    other = gen.cronjob("export", *gen.BY_HAND, gen.service_account("exporter"))
    kubernetes.client.CoreV1Api(api).create_namespaced_service_account(
        namespace, {"metadata": {"name": "exporter"}}
    )
    batch.create_namespaced_cron_job(namespace, copy.deepcopy(other))

    [message] = wait_event(api, namespace, "report", "Conflict")
    assert (
        f"Role {namespace}/cronlock-holder-default exists and was not made by cronlock" in message
    )
    # The other ServiceAccount's CronJob in the same namespace is guarded all the same.
    wait_for(lambda: injected(api, namespace, "export"), 30, "the other CronJob to be injected")
    role = rbac.read_namespaced_role("cronlock-holder-exporter", namespace)
    assert role.rules[0].resource_names == ["cronlock-export"]
    operator_caught_up(api)
    holds(
        lambda: (
            not injected(api, namespace, "report")
            and stored(rbac.read_namespaced_role("cronlock-holder-default", namespace), api)
            == before
        ),
        2,
        "the CronJob stays uninjected and the admin's Role unchanged",
    )
    binding_names = {
        item.metadata.name for item in rbac.list_namespaced_role_binding(namespace).items
    }
    assert "cronlock-holder-default" not in binding_names


def test_a_change_the_api_server_refuses_is_one_warning_not_an_endless_retry(
    api: kubernetes.client.ApiClient, namespace: str
) -> None:
    batch = kubernetes.client.BatchV1Api(api)
    batch.create_namespaced_cron_job(namespace, gen.cronjob("report", *gen.BY_HAND))
    wait_for(lambda: injected(api, namespace, "report"), 30, "the CronJob to be injected")
    # A record cronlock never writes on this CronJob: reverting it would set a restartPolicy
    # no Job may have.
    annotate(api, namespace, "report", original_restart_policy="Always", enabled="false")

    [message] = wait_event(api, namespace, "report", "ReconcileError")
    assert "the API server refused cronlock's change" in message
    assert "restartPolicy" in message
    operator_caught_up(api)

    def one_warning_and_unchanged() -> bool:
        refused = [r for _, r, _ in events(api, namespace, "report") if r == "ReconcileError"]
        assert len(refused) == 1, f"{len(refused)} ReconcileError Events: retried"
        return injected(api, namespace, "report")

    # Five seconds: the work queue's backoff (0.5, 1, 2 s, ...) would retry within them.
    holds(one_warning_and_unchanged, 5, "one ReconcileError, the CronJob left as it was")
