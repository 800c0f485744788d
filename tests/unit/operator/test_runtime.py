"""The operator's runtime between reconciles: conflicts and refusals, without an API server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cronlock_operator.errors import NotOurs, Rejected, RequeueAfter, Retry
from cronlock_operator.runtime import metrics
from cronlock_operator.runtime.reconciler import CONFLICT_RECHECK, CronJobKey, Reconciler
from tests.support.cronjobs import SETTINGS, make_cronjob, server_defaults


class FakeKube:
    """Records writes; `foreign_lease`, `foreign_role` and `reject` fail them as the API would."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.patches = 0
        self.rbac_writes: list[tuple[str, ...]] = []
        self.foreign_lease = False
        self.foreign_role = ""
        self.reject = False
        self.transient = False

    def ensure_lease(self, namespace: str, name: str, *args: Any) -> None:
        if self.transient:
            raise Retry(f"ensure lease {namespace}/{name}: HTTP 503 Service Unavailable")
        if self.foreign_lease:
            raise NotOurs(f"lease {namespace}/{name} exists and lacks the label")

    def write_holder_rbac(self, namespace: str, roles: Any, bindings: Any) -> None:
        names = tuple(role["metadata"]["name"] for role in roles)
        self.rbac_writes.append(names)
        if self.foreign_role in names:
            message = f"Role {namespace}/{self.foreign_role} exists and was not made by cronlock"
            raise NotOurs(message, {self.foreign_role: message})

    def patch_cronjob(self, namespace: str, name: str, patch: Any) -> dict[str, Any]:
        if self.reject:
            raise Rejected('CronJob.batch "report" is invalid: restartPolicy')
        self.patches += 1
        return {"metadata": {"namespace": namespace, "name": name, "resourceVersion": "1"}}

    def post_event(self, involved: Any, reason: str, message: str, warning: bool = False) -> None:
        self.events.append((reason, message))

    def drop_lease_owner(self, *args: Any) -> None:
        pass


def setup(**account: str) -> tuple[Reconciler, FakeKube]:
    kube = FakeKube()
    reconciler = Reconciler(kube=kube, settings=SETTINGS)  # type: ignore[arg-type]
    for name, service_account in {"report": "default", **account}.items():
        body = server_defaults(make_cronjob(name=name, serviceAccountName=service_account))
        body["metadata"]["uid"] = f"uid-{name}"
        reconciler.on_cronjob("ADDED", body)
    return reconciler, kube


def counted_errors() -> float:
    sample = metrics.registry.get_sample_value(
        "cronlock_reconcile_errors_total", {"kind": CronJobKey.kind}
    )
    return sample or 0.0


def reasons(kube: FakeKube) -> list[str]:
    return [reason for reason, _ in kube.events]


def test_a_foreign_lease_refuses_the_cronjob_once_and_keeps_it_out_of_the_roles() -> None:
    reconciler, kube = setup(export="default")
    kube.foreign_lease = True
    for _ in range(2):  # the periodic recheck finds the same conflict
        with pytest.raises(Retry):
            reconciler.reconcile_cronjob("team-a", "report")
    assert reasons(kube) == ["Conflict"]
    assert kube.patches == 0
    assert ("team-a", "report") not in reconciler.guards
    kube.foreign_lease = False
    reconciler.reconcile_cronjob("team-a", "export")
    # The refused CronJob's Lease is granted to nobody, not even as a pending guard.
    granted = reconciler.synced_rbac["team-a"]
    assert {guard.lease for guard in granted} == {"cronlock-export"}

    reconciler.reconcile_cronjob("team-a", "report")  # the name was freed meanwhile
    assert kube.patches == 2
    assert ("team-a", "report") not in reconciler.conflicted


def test_a_conflict_rechecked_later_is_not_counted_as_a_reconcile_error() -> None:
    """Review finding 21: the look-again-in-a-minute of a refused CronJob counted one
    reconcile error a minute for as long as the conflict lasted; a transient error counts."""
    reconciler, kube = setup()
    kube.foreign_lease = True
    before = counted_errors()
    with pytest.raises(RequeueAfter) as requeued:
        asyncio.run(reconciler._reconcile(CronJobKey("team-a", "report")))
    assert requeued.value.delay == CONFLICT_RECHECK
    assert counted_errors() == before
    kube.foreign_lease = False
    kube.transient = True
    with pytest.raises(Retry):
        asyncio.run(reconciler._reconcile(CronJobKey("team-a", "report")))
    assert counted_errors() == before + 1


def test_a_foreign_role_holds_back_only_the_cronjobs_of_its_account() -> None:
    reconciler, kube = setup(export="exporter")
    kube.foreign_role = "cronlock-holder-default"
    with pytest.raises(Retry):
        reconciler.reconcile_cronjob("team-a", "report")
    reconciler.reconcile_cronjob("team-a", "export")
    assert reasons(kube) == ["Conflict", "Injected"]
    assert kube.patches == 1
    assert all("cronlock-holder-exporter" in names for names in kube.rbac_writes)


def test_a_refused_patch_is_one_warning_and_no_retry() -> None:
    reconciler, kube = setup()
    kube.reject = True
    reconciler.reconcile_cronjob("team-a", "report")
    reconciler.reconcile_cronjob("team-a", "report")
    assert reasons(kube) == ["ReconcileError"]
    kube.reject = False
    reconciler.reconcile_cronjob("team-a", "report")
    assert reasons(kube) == ["ReconcileError", "Injected"]


class NamespacedRbacKube(FakeKube):
    """Also records in which namespace each holder RBAC write went."""

    def __init__(self, foreign_in: str = "", failing_in: str = "") -> None:
        super().__init__()
        self.rbac_namespaces: list[str] = []
        self.foreign_in = foreign_in
        self.failing_in = failing_in

    def write_holder_rbac(self, namespace: str, roles: Any, bindings: Any) -> None:
        if namespace == self.failing_in:
            raise ConnectionError("the API server went away")
        self.rbac_namespaces.append(namespace)
        if namespace == self.foreign_in:
            message = f"Role {namespace}/cronlock-holder-default was not made by cronlock"
            raise NotOurs(message, {"cronlock-holder-default": message})


def test_start_up_writes_every_namespaces_holder_rbac_once_before_the_reconciles() -> None:
    kube = NamespacedRbacKube(foreign_in="team-c")
    reconciler = Reconciler(kube=kube, settings=SETTINGS)  # type: ignore[arg-type]
    for namespace in ("team-a", "team-b", "team-c"):
        for name in ("report", "export"):
            body = server_defaults(make_cronjob(name=name, namespace=namespace))
            body["metadata"]["uid"] = f"uid-{namespace}-{name}"
            reconciler.cronjobs.put(body)  # as the start-up list fills the cache

    asyncio.run(reconciler.sync_all_rbac())  # the foreign Role in team-c is no reason to stop

    assert sorted(kube.rbac_namespaces) == ["team-a", "team-b", "team-c"]
    for namespace in ("team-a", "team-b"):
        granted = {guard.lease for guard in reconciler.synced_rbac[namespace]}
        assert granted == {"cronlock-report", "cronlock-export"}
    assert "team-c" not in reconciler.synced_rbac
    for namespace in ("team-a", "team-b"):
        for name in ("report", "export"):
            reconciler.reconcile_cronjob(namespace, name)
    # Each CronJob found its namespace's Roles written: no more RBAC writes, only patches.
    assert sorted(kube.rbac_namespaces) == ["team-a", "team-b", "team-c"]
    assert kube.patches == 4
    with pytest.raises(Retry):  # team-c's CronJobs are refused by their own reconcile
        reconciler.reconcile_cronjob("team-c", "report")
    assert reasons(kube).count("Conflict") == 1


def test_a_namespace_whose_rbac_fails_at_start_up_is_logged_and_stops_no_other(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = NamespacedRbacKube(failing_in="team-b")
    reconciler = Reconciler(kube=kube, settings=SETTINGS)  # type: ignore[arg-type]
    for namespace in ("team-a", "team-b", "team-c"):
        body = server_defaults(make_cronjob(name="report", namespace=namespace))
        body["metadata"]["uid"] = f"uid-{namespace}"
        reconciler.cronjobs.put(body)

    with caplog.at_level(logging.WARNING):
        asyncio.run(reconciler.sync_all_rbac())

    assert sorted(kube.rbac_namespaces) == ["team-a", "team-c"]
    assert "team-b" not in reconciler.synced_rbac  # its CronJob's reconcile writes it
    assert "holder RBAC in team-b not written yet: the API server went away" in caplog.text


KEYS = [
    "cronlock.io/enabled",
    "cronlock.io/lock",
    "cronlock.io/ttl",
    "cronlock.io/renew",
    "cronlock.io/policy",
    "cronlock.io/wait-timeout",
    "cronlock.io/stop",
    "cronlock.io/alert-after",
    "cronlock.io/keep-skipped-jobs",
    "cronlock.io/consecutive-skips",
    "cronlock.io/original-restart-policy",
    "cronlock.io/original-share-process-namespace",
    "cronlock.io/original-termination-grace-period-seconds",
    "cronlock.io/unknown",
]
VALUES = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["true", "false", "", "0", "-1", "1e9", "9" * 5000, "30s", "1h", "wait"]),
    st.integers(min_value=0, max_value=10**30).map(str),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    annotations=st.one_of(
        st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=1),
        st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=6),
    )
)
@example(annotations={"cronlock.io/alert-after": "9" * 5000})
@example(annotations={"cronlock.io/consecutive-skips": "9" * 5000})
@example(annotations={"cronlock.io/original-termination-grace-period-seconds": "9" * 5000})
@example(annotations={"cronlock.io/original-restart-policy": "Always"})
def test_no_annotation_on_one_cronjob_stops_another_in_its_namespace(
    annotations: dict[str, str],
) -> None:
    """Fuzzed: whatever one CronJob carries, reconciling it ends normally, with an Event
    or with a retry, and the next CronJob of the namespace is injected as usual."""
    reconciler, kube = setup(export="default")
    hostile = reconciler.cronjobs.get(("team-a", "report"))
    assert hostile is not None
    hostile["metadata"]["annotations"] = {"cronlock.io/enabled": "true", **annotations}
    reconciler.on_cronjob("MODIFIED", hostile)
    with contextlib.suppress(Retry):
        reconciler.reconcile_cronjob("team-a", "report")
    reconciler.reconcile_cronjob("team-a", "export")
    assert kube.events[-1][0] == "Injected"
    assert ("team-a", "export") in reconciler.guards
    assert any(guard.lease == "cronlock-export" for guard in reconciler.synced_rbac["team-a"])


def test_the_watch_event_of_our_own_patch_is_not_reconciled_again() -> None:
    reconciler, kube = setup()
    key = CronJobKey("team-a", "report")
    reconciler.queue = type(reconciler.queue)(reconciler.queue.work)  # forget setup's keys
    reconciler.reconcile_cronjob("team-a", "report")
    assert kube.patches == 1
    body = reconciler.cronjobs.get(("team-a", "report"))
    assert body is not None
    body["metadata"]["resourceVersion"] = "1"  # what the patch answered
    reconciler.on_cronjob("MODIFIED", body)
    assert not reconciler.queue.waiting(key)
    body["metadata"]["resourceVersion"] = "2"  # someone else's change after ours
    reconciler.on_cronjob("MODIFIED", body)
    assert reconciler.queue.waiting(key)
