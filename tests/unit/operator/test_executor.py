"""The executor's three read-then-judge actions, against the in-memory API server: what it
writes for a Lease created meanwhile, a Lease's users, and a Role someone else made."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from prometheus_client import generate_latest

from cronlock_operator.cronjob.config import parse_config
from cronlock_operator.reconcile import rbac
from cronlock_operator.reconcile.actions import (
    CountMissed,
    CountTick,
    DropLeaseOwner,
    EnsureLease,
    SetRunTimes,
)
from cronlock_operator.runtime import metrics
from cronlock_operator.runtime.executor import Executor, Ran, Refused, Undecided
from tests.support import gen
from tests.support.cronjobs import SETTINGS
from tests.support.fakekube import FakeKube
from tests.support.leases import make_lease
from tests.support.prometheus import samples

OURS = {"app.kubernetes.io/managed-by": "cronlock", "cronlock.io/lock": "report"}


# A CronJob of lock report.
REPORTS = gen.annotated({"cronlock.io/lock": "report"})


def lease(*owners: tuple[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    """Lock report's Lease in team-a at version 7, used by `owners` (name, uid); `labels` as
    make_lease's (by default OURS)."""
    return make_lease(namespace="team-a", owners=owners, labels=labels, resource_version="7")


def ensure(
    body: dict[str, Any], cached: dict[str, Any] | None, *others: dict[str, Any]
) -> EnsureLease:
    by_name = {other["metadata"]["name"]: other for other in others}
    return EnsureLease(
        "team-a", "cronlock-report", body, parse_config(body, SETTINGS), cached, by_name
    )


def test_a_new_lock_gets_its_lease_created_and_heard() -> None:
    kube, heard = FakeKube(), []
    Executor(kube, lease_written=heard.append).run(
        [ensure(gen.cronjob("report", REPORTS, gen.with_uid("u-report")), None)]
    )
    stored = kube.leases[("team-a", "cronlock-report")]
    assert stored["metadata"]["labels"] == OURS
    assert [owner["uid"] for owner in stored["metadata"]["ownerReferences"]] == ["u-report"]
    assert heard == [stored]


def test_a_lease_the_cache_had_not_seen_is_judged_as_read() -> None:
    """409: the adapter hands back the Lease that exists, and consent is judged on it."""
    kube = FakeKube(leases=[lease(("export", "u-export"))])
    ran = Executor(kube).run(
        [
            ensure(
                gen.cronjob("report", REPORTS, gen.with_uid("u-report")),
                None,
                gen.cronjob("export", REPORTS, gen.with_uid("u-export")),
            )
        ]
    )
    assert isinstance(ran.verdict, Refused)
    assert "lock report is already used by CronJob export" in ran.verdict.reason
    assert kube.called("merge_lease") == []

    consenting = gen.cronjob(
        "export",
        REPORTS,
        gen.with_uid("u-export"),
        gen.annotated({"cronlock.io/share-lock-with": "report"}),
    )
    Executor(kube).run(
        [ensure(gen.cronjob("report", REPORTS, gen.with_uid("u-report")), None, consenting)]
    )
    owners = kube.leases[("team-a", "cronlock-report")]["metadata"]["ownerReferences"]
    assert sorted(owner["name"] for owner in owners) == ["export", "report"]


def test_a_foreign_lease_is_refused_and_left_as_it_was() -> None:
    kube = FakeKube(leases=[lease(labels={})])
    ran = Executor(kube).run(
        [ensure(gen.cronjob("report", REPORTS, gen.with_uid("u-report")), None)]
    )
    assert isinstance(ran.verdict, Refused)
    assert "exists and lacks the label" in ran.verdict.reason
    assert kube.leases[("team-a", "cronlock-report")]["metadata"]["labels"] == {}


def test_an_unseen_user_is_undecided_and_an_owned_lease_writes_nothing() -> None:
    kube = FakeKube(leases=[lease(("gone", "u-gone"))])
    ran = Executor(kube).run(
        [
            ensure(
                gen.cronjob("report", REPORTS, gen.with_uid("u-report")),
                kube.leases[("team-a", "cronlock-report")],
            )
        ]
    )
    assert isinstance(ran.verdict, Undecided)
    assert "not (yet) seen" in ran.verdict.reason
    owned = lease(("report", "u-report"))
    assert (
        Executor(kube)
        .run([ensure(gen.cronjob("report", REPORTS, gen.with_uid("u-report")), owned)])
        .completed
    )
    assert [name for name, _ in kube.calls] == []


STORE_SETTINGS = dataclasses.replace(SETTINGS, sidecar_stores_image="ghcr.io/example/stores:1.0.0")
IN_REDIS = {"cronlock.io/store": "redis", "cronlock.io/store-secret": "team-locks"}


def test_a_store_locks_lease_says_where_the_lock_lives() -> None:
    """Security review L-N5: a lock in Redis or PostgreSQL keeps its Lease as a registry of
    its users; the Lease says so (and names the Secret), so `cronlock freeze` can refuse
    to freeze it there, where no run would read the freeze."""
    kube = FakeKube()

    def ensure_in(body: dict[str, Any], cached: dict[str, Any] | None) -> None:
        config = parse_config(body, STORE_SETTINGS)
        Executor(kube).run([EnsureLease("team-a", "cronlock-report", body, config, cached)])

    ensure_in(
        gen.cronjob("report", REPORTS, gen.with_uid("u-report"), gen.annotated(IN_REDIS)), None
    )
    stored = kube.leases[("team-a", "cronlock-report")]
    assert stored["metadata"]["annotations"] == IN_REDIS
    # A registry Lease made before the mark existed gets it; a marked one is left alone.
    del stored["metadata"]["annotations"]
    ensure_in(
        gen.cronjob("report", REPORTS, gen.with_uid("u-report"), gen.annotated(IN_REDIS)),
        copy.deepcopy(stored),
    )
    assert stored["metadata"]["annotations"] == IN_REDIS
    writes = len(kube.called("merge_lease"))
    ensure_in(
        gen.cronjob("report", REPORTS, gen.with_uid("u-report"), gen.annotated(IN_REDIS)),
        copy.deepcopy(stored),
    )
    assert len(kube.called("merge_lease")) == writes
    # The lock moved into its Lease: the marks go.
    ensure_in(gen.cronjob("report", REPORTS, gen.with_uid("u-report")), copy.deepcopy(stored))
    assert "cronlock.io/store" not in stored["metadata"]["annotations"]
    assert "cronlock.io/store-secret" not in stored["metadata"]["annotations"]


def test_a_locks_lease_says_its_permits_when_made_and_when_changed() -> None:
    kube = FakeKube()

    def ensure_asking(count: str | None, cached: dict[str, Any] | None) -> Ran:
        notes = {} if count is None else {"cronlock.io/permits": count}
        body = gen.cronjob("report", REPORTS, gen.with_uid("u-report"), gen.annotated(notes))
        config = parse_config(body, SETTINGS)
        return Executor(kube).run([EnsureLease("team-a", "cronlock-report", body, config, cached)])

    assert ensure_asking("2", None).completed
    stored = kube.leases[("team-a", "cronlock-report")]
    assert stored["metadata"]["annotations"] == {"cronlock.io/permits": "2"}
    writes = len(kube.called("merge_lease"))
    assert ensure_asking("2", copy.deepcopy(stored)).completed
    assert len(kube.called("merge_lease")) == writes
    assert ensure_asking("5", copy.deepcopy(stored)).completed
    assert stored["metadata"]["annotations"]["cronlock.io/permits"] == "5"
    # Back to one: the annotation goes (absent is 1, as the sidecar reads it).
    assert ensure_asking(None, copy.deepcopy(stored)).completed
    assert "cronlock.io/permits" not in stored["metadata"].get("annotations", {})


def test_a_user_asking_other_permits_than_its_lock_is_refused_and_writes_nothing() -> None:
    export = gen.cronjob(
        "export", gen.with_uid("u-export"), gen.annotated({"cronlock.io/permits": "2"})
    )
    kube = FakeKube(
        leases=[lease(("report", "u-report"), ("export", "u-export"))],
    )
    stored = kube.leases[("team-a", "cronlock-report")]
    stored["metadata"]["annotations"] = {"cronlock.io/permits": "2"}
    body = gen.cronjob(
        "report", REPORTS, gen.with_uid("u-report"), gen.annotated({"cronlock.io/permits": "3"})
    )
    config = parse_config(body, SETTINGS)
    ran = Executor(kube).run(
        [
            EnsureLease(
                "team-a", "cronlock-report", body, config, copy.deepcopy(stored), {"export": export}
            )
        ]
    )
    assert isinstance(ran.verdict, Refused)
    assert "lock report has 2 permits, as CronJob export asks" in ran.verdict.reason
    assert kube.called("merge_lease") == []
    assert stored["metadata"]["annotations"] == {"cronlock.io/permits": "2"}


def test_dropping_an_owner_keeps_the_others_then_deletes_with_the_last() -> None:
    kube = FakeKube(leases=[lease(("report", "u-report"), ("export", "u-export"))])
    Executor(kube).run([DropLeaseOwner("team-a", "cronlock-report", "u-report")])
    owners = kube.leases[("team-a", "cronlock-report")]["metadata"]["ownerReferences"]
    assert [owner["uid"] for owner in owners] == ["u-export"]
    Executor(kube).run([DropLeaseOwner("team-a", "cronlock-report", "u-export")])
    assert ("team-a", "cronlock-report") not in kube.leases


def test_a_lease_that_moved_while_its_owner_was_dropped_is_undecided() -> None:
    kube = FakeKube(leases=[lease(("report", "u-report"), ("export", "u-export"))])
    original = kube.patch_lease

    def moved(namespace: str, name: str, patch: list[dict[str, Any]]) -> bool:
        kube.leases[(namespace, name)]["metadata"]["resourceVersion"] = "8"
        return original(namespace, name, patch)

    kube.patch_lease = moved  # type: ignore[method-assign]
    ran = Executor(kube).run([DropLeaseOwner("team-a", "cronlock-report", "u-report")])
    assert ran == Ran(
        verdict=Undecided("lease team-a/cronlock-report changed while dropping an owner")
    )


def test_holder_rbac_writes_its_own_names_a_foreign_role_and_deletes_the_stale() -> None:
    kube = FakeKube()
    holder = kube.rbac
    guards = [rbac.Guard("cronlock-report", "runner"), rbac.Guard("cronlock-x", "batch")]
    _, actions = rbac.decide("team-a", guards, None)
    holder.objects[("Role", "team-a", "cronlock-holder-batch")] = {
        "metadata": {"name": "cronlock-holder-batch", "labels": {}}
    }
    holder.objects[("Role", "team-a", "cronlock-holder-old")] = {
        "metadata": {
            "name": "cronlock-holder-old",
            "labels": {"app.kubernetes.io/managed-by": "cronlock"},
        }
    }
    ran = Executor(kube).run(actions)
    assert isinstance(ran.verdict, Refused)
    assert list(ran.verdict.names) == ["cronlock-holder-batch"]
    assert holder.names("Role", "team-a") == ["cronlock-holder-batch", "cronlock-holder-runner"]
    assert holder.names("RoleBinding", "team-a") == ["cronlock-holder-runner"]
    # In sync: a second write reads and writes nothing new.
    holder.calls.clear()
    del holder.objects[("Role", "team-a", "cronlock-holder-batch")]
    Executor(kube).run(actions)
    Executor(kube).run(actions)
    writes = [name for name, _ in holder.calls if name in ("create", "replace", "delete")]
    assert writes == ["create", "create"]  # the batch Role and RoleBinding, once


def tick_counts(cronjob: str) -> dict[str, float]:
    """cronlock_ticks_total of one CronJob by outcome, as Prometheus' parser reads /metrics."""
    page = generate_latest(metrics.registry).decode()
    return {
        labels["outcome"]: value
        for labels, value in samples(page, "cronlock_ticks_total")
        if labels["namespace"] == "team-t" and labels["cronjob"] == cronjob
    }


def test_ticks_are_counted_by_outcome_from_zero_and_missed_ones_too() -> None:
    """Every outcome exists at 0 once the CronJob's times are known (increase() sees the
    first one); a tick's outcome and a missed tick each count; the series go with the
    CronJob."""
    executor = Executor(FakeKube())
    executor.run([SetRunTimes("team-t", "ticking", 1e9, None, False)])
    assert tick_counts("ticking") == dict.fromkeys(metrics.TICK_OUTCOMES, 0.0)
    executor.run(
        [
            CountTick("team-t", "ticking", "worked"),
            CountTick("team-t", "ticking", "already_ran"),
            CountTick("team-t", "ticking", "already_ran"),
            CountMissed("team-t", "ticking", 3),
        ]
    )
    assert tick_counts("ticking") == {
        "worked": 1.0,
        "overlap": 0.0,
        "already_ran": 2.0,
        "frozen": 0.0,
        "missed": 3.0,
    }
    metrics.forget_cronjob("team-t", "ticking")
    assert tick_counts("ticking") == {}
