"""A lock is only its runs': a CronJob cannot join another CronJob's lock (and have its
ServiceAccount granted that Lease) unless a CronJob already using the lock names it.

The attacker here holds a token that may create CronJobs in the namespace and edit only
her own: she cannot forge the consent, which lives on the other team's CronJob.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes
import pytest

from tests.support import gen
from tests.support.controlplane import ControlPlane
from tests.support.kube import holds, wait_for
from tests.support.objects import annotate, cronjob_editor, injected, wait_event
from tests.support.operator import OperatorProcess, operator_caught_up

pytestmark = pytest.mark.usefixtures("operator")

ON_LEDGER = gen.annotated({"cronlock.io/lock": "ledger"})
IN_REDIS = gen.in_store("redis", "team-locks")


def granted(api: kubernetes.client.ApiClient, namespace: str, account: str) -> set[str]:
    rbac = kubernetes.client.RbacAuthorizationV1Api(api)
    try:
        role = rbac.read_namespaced_role(f"cronlock-holder-{account}", namespace)
    except kubernetes.client.ApiException as error:
        if error.status == 404:
            return set()
        raise
    return {name for rule in role.rules for name in rule.resource_names or []}


def owners(api: kubernetes.client.ApiClient, namespace: str, lease: str) -> list[str]:
    try:
        found = kubernetes.client.CoordinationV1Api(api).read_namespaced_lease(lease, namespace)
    except kubernetes.client.ApiException as error:
        if error.status == 404:
            return []
        raise
    return sorted(owner.name for owner in found.metadata.owner_references or [])


def test_a_cronjob_editor_cannot_join_another_teams_lock_until_that_team_names_her_cronjob(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    service_account_kubeconfig: Any,
) -> None:
    core = kubernetes.client.CoreV1Api(api)
    for account in ("billing", "ci"):
        core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    batch = kubernetes.client.BatchV1Api(api)
    batch.create_namespaced_cron_job(
        namespace, gen.cronjob("invoices", *gen.BY_HAND, gen.service_account("billing"), ON_LEDGER)
    )
    wait_for(lambda: injected(api, namespace, "invoices"), 30, "the team's CronJob injected")
    wait_for(lambda: "cronlock-ledger" in granted(api, namespace, "billing"), 30, "its Role")
    as_mallory = cronjob_editor(api, namespace, service_account_kubeconfig, controlplane, "squat")

    # Her own CronJob on the team's lock, run as her account, even naming itself as a peer.
    as_mallory.create_namespaced_cron_job(
        namespace,
        gen.cronjob(
            "squat",
            *gen.BY_HAND,
            gen.service_account("ci"),
            ON_LEDGER,
            gen.annotated({"cronlock.io/share-lock-with": "squat,invoices"}),
        ),
    )

    [message] = wait_event(api, namespace, "squat", "Conflict")
    assert "lock ledger is already used by CronJob invoices" in message
    assert "cronlock.io/share-lock-with: squat" in message
    operator_caught_up(api)
    holds(
        lambda: (
            not injected(api, namespace, "squat")
            and "cronlock-ledger" not in granted(api, namespace, "ci")
        ),
        2,
        "her CronJob stays uninjected and her account ungranted",
    )
    assert owners(api, namespace, "cronlock-ledger") == ["invoices"]
    # The consent is on the team's CronJob, which her token may not change.
    with pytest.raises(kubernetes.client.ApiException) as denied:
        as_mallory.patch_namespaced_cron_job(
            "invoices",
            namespace,
            {"metadata": {"annotations": {"cronlock.io/share-lock-with": "squat"}}},
        )
    assert denied.value.status == 403

    # The team names her CronJob: it joins at the next look (within a minute, or at once on
    # a change of hers), and her account is granted the Lease with the team's.
    annotate(api, namespace, "invoices", share_lock_with="squat")
    as_mallory.patch_namespaced_cron_job(
        "squat", namespace, {"metadata": {"annotations": {"cronlock.io/ttl": "60s"}}}
    )
    wait_for(lambda: injected(api, namespace, "squat"), 30, "the joining CronJob injected")
    wait_for(lambda: "cronlock-ledger" in granted(api, namespace, "ci"), 30, "the joiner's Role")
    assert owners(api, namespace, "cronlock-ledger") == ["invoices", "squat"]
    assert injected(api, namespace, "invoices")


def test_a_malformed_share_list_is_invalid_config_and_changes_nothing(
    api: kubernetes.client.ApiClient, namespace: str
) -> None:
    kubernetes.client.BatchV1Api(api).create_namespaced_cron_job(
        namespace,
        gen.cronjob(
            "report",
            *gen.BY_HAND,
            gen.service_account("default"),
            gen.annotated({"cronlock.io/share-lock-with": "export, Not_A_Name"}),
        ),
    )

    [message] = wait_event(api, namespace, "report", "InvalidConfig")
    assert "cronlock.io/share-lock-with" in message
    assert "'Not_A_Name', which is not a CronJob name" in message
    operator_caught_up(api)
    holds(lambda: not injected(api, namespace, "report"), 2, "the CronJob stays uninjected")


def test_the_shared_lock_example_guards_both_cronjobs_with_one_lease(
    api: kubernetes.client.ApiClient, namespace: str, controlplane: ControlPlane
) -> None:
    """manifests/examples/shared-lock.yaml as a user applies it, the operator running."""
    example = Path(__file__).resolve().parents[2] / "manifests" / "examples" / "shared-lock.yaml"
    controlplane.kubectl("apply", "-n", namespace, "-f", str(example))

    for name in ("import-orders", "rebuild-index"):
        wait_for(lambda name=name: injected(api, namespace, name), 30, f"{name} injected")
    wait_for(
        lambda: owners(api, namespace, "cronlock-orders-db") == ["import-orders", "rebuild-index"],
        30,
        "one Lease owned by both",
    )


def test_an_operator_restart_grants_no_lock_nobody_consented_to(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    service_account_kubeconfig: Any,
    operator: OperatorProcess,
) -> None:
    """Security review N2: the start-up RBAC sync knew no Lease yet, so every opted-in
    CronJob's account got its lock, consent or not, until the namespace's next change."""
    core = kubernetes.client.CoreV1Api(api)
    for account in ("billing", "ci"):
        core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    kubernetes.client.BatchV1Api(api).create_namespaced_cron_job(
        namespace, gen.cronjob("invoices", *gen.BY_HAND, gen.service_account("billing"), ON_LEDGER)
    )
    wait_for(lambda: "cronlock-ledger" in granted(api, namespace, "billing"), 30, "its Role")
    as_mallory = cronjob_editor(api, namespace, service_account_kubeconfig, controlplane, "squat")
    as_mallory.create_namespaced_cron_job(
        namespace, gen.cronjob("squat", *gen.BY_HAND, gen.service_account("ci"), ON_LEDGER)
    )
    wait_event(api, namespace, "squat", "Conflict")

    operator.restart()
    operator_caught_up(api)

    holds(
        lambda: (
            "cronlock-ledger" not in granted(api, namespace, "ci")
            and "cronlock-ledger" in granted(api, namespace, "billing")
            and not injected(api, namespace, "squat")
        ),
        3,
        "after the restart: only the team's account granted, her CronJob uninjected",
    )


def test_a_cronjob_editor_cannot_join_a_teams_lock_in_a_store_without_its_consent(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    service_account_kubeconfig: Any,
) -> None:
    """Security review H1 (A): a lock in Redis or PostgreSQL has a Lease as its registry,
    so joining it asks the same consent a Lease lock asks; nobody's pods are granted it;
    and one lock name cannot be kept in two places."""
    core = kubernetes.client.CoreV1Api(api)
    for account in ("billing", "ci"):
        core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    batch = kubernetes.client.BatchV1Api(api)
    batch.create_namespaced_cron_job(
        namespace,
        gen.cronjob("invoices", *gen.BY_HAND, gen.service_account("billing"), ON_LEDGER, IN_REDIS),
    )
    wait_for(lambda: injected(api, namespace, "invoices"), 30, "the team's CronJob injected")
    assert owners(api, namespace, "cronlock-ledger") == ["invoices"]
    as_mallory = cronjob_editor(api, namespace, service_account_kubeconfig, controlplane, "squat")

    as_mallory.create_namespaced_cron_job(
        namespace,
        gen.cronjob("squat", *gen.BY_HAND, gen.service_account("ci"), ON_LEDGER, IN_REDIS),
    )
    [message] = wait_event(api, namespace, "squat", "Conflict")
    assert "lock ledger is already used by CronJob invoices" in message
    assert not injected(api, namespace, "squat")
    # The registry is no holder's: no account is granted the Lease.
    assert granted(api, namespace, "billing") == set()
    assert granted(api, namespace, "ci") == set()

    # The team consents; a third CronJob keeping the same lock in the Lease is refused.
    annotate(api, namespace, "invoices", share_lock_with="squat,inlease")
    # At once, not CONFLICT_RECHECK (60 s) later: the consent is a change in the namespace.
    wait_for(lambda: injected(api, namespace, "squat"), 15, "squat injected with consent")
    assert owners(api, namespace, "cronlock-ledger") == ["invoices", "squat"]
    batch.create_namespaced_cron_job(
        namespace, gen.cronjob("inlease", *gen.BY_HAND, gen.service_account("ci"), ON_LEDGER)
    )
    [mixed] = wait_event(api, namespace, "inlease", "Conflict")
    assert "lock ledger is kept in redis (Secret team-locks) by CronJob" in mixed
    assert "this CronJob asks for the Lease" in mixed
    assert not injected(api, namespace, "inlease")
    assert granted(api, namespace, "ci") == set()
