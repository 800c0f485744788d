"""The lock's N permits on a real API server: the operator writes what the CronJobs sharing
the lock agree on onto its Lease, and a CronJob asking another N is a `Conflict`."""

from __future__ import annotations

import kubernetes
import pytest

from tests.support import gen
from tests.support.kube import wait_for
from tests.support.objects import annotate, events, injected, wait_event

pytestmark = pytest.mark.usefixtures("operator")

ON_LEDGER = gen.annotated({"cronlock.io/lock": "ledger"})


def lease_permits(api: kubernetes.client.ApiClient, namespace: str) -> str | None:
    try:
        lease = kubernetes.client.CoordinationV1Api(api).read_namespaced_lease(
            "cronlock-ledger", namespace
        )
    except kubernetes.client.ApiException as error:
        if error.status == 404:
            return None
        raise
    return (lease.metadata.annotations or {}).get("cronlock.io/permits")


def test_cronjobs_sharing_a_lock_agree_on_its_permits_or_the_odd_one_is_a_conflict(
    api: kubernetes.client.ApiClient, namespace: str
) -> None:
    kubernetes.client.CoreV1Api(api).create_namespaced_service_account(
        namespace, {"metadata": {"name": "billing"}}
    )
    batch = kubernetes.client.BatchV1Api(api)
    two = gen.annotated({"cronlock.io/permits": "2"})
    batch.create_namespaced_cron_job(
        namespace,
        gen.cronjob(
            "invoices",
            *gen.BY_HAND,
            gen.service_account("billing"),
            ON_LEDGER,
            two,
            gen.annotated({"cronlock.io/share-lock-with": "export"}),
        ),
    )
    wait_for(lambda: injected(api, namespace, "invoices"), 30, "invoices injected")
    assert lease_permits(api, namespace) == "2"
    batch.create_namespaced_cron_job(
        namespace,
        gen.cronjob("export", *gen.BY_HAND, gen.service_account("billing"), ON_LEDGER, two),
    )
    wait_for(lambda: injected(api, namespace, "export"), 30, "export injected")
    assert lease_permits(api, namespace) == "2"
    assert [
        reason for _, reason, _ in events(api, namespace, "export") if reason == "Conflict"
    ] == []

    # Export alone asks for 3: refused, and the lock keeps the 2 invoices still asks.
    annotate(api, namespace, "export", permits="3")
    [message] = wait_event(api, namespace, "export", "Conflict")
    assert "lock ledger has 2 permits, as CronJob invoices asks (cronlock.io/permits); " in message
    assert "this CronJob asks for 3" in message
    assert "Set it to 2 here, or to 3 on invoices as well" in message
    assert lease_permits(api, namespace) == "2"

    # Invoices agrees: the last one to ask the new N writes it.
    annotate(api, namespace, "invoices", permits="3")
    wait_for(lambda: lease_permits(api, namespace) == "3", 30, "the lock's N to become 3")
    assert [
        reason for _, reason, _ in events(api, namespace, "invoices") if reason == "Conflict"
    ] == []
