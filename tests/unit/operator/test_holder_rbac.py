"""The holder RBAC reconciler built alone, without the router: an `RbacKey` brings a
namespace's holder Roles in line with the guards it reads, read only, from the CronJob
reconciler's book, and it publishes what it wrote as `HolderGrants`."""

from __future__ import annotations

import copy

from cronlock_operator.cronjob.reading import Readings
from cronlock_operator.kube.cache import ObjectCache
from cronlock_operator.reconcile.guards import GuardBook
from cronlock_operator.reconcile.keys import RbacKey
from cronlock_operator.reconcile.rbac import Guard
from cronlock_operator.runtime.executor import Executor
from cronlock_operator.runtime.holder_rbac import HolderRbacReconciler
from cronlock_operator.runtime.workqueue import DONE
from tests.support import gen
from tests.support.cronjobs import SETTINGS, server_defaults
from tests.support.fakekube import FakeKube

REPORT = Guard("cronlock-report", "reports")
EXPORT = Guard("cronlock-export", "exporter")


def alone(book: GuardBook) -> tuple[HolderRbacReconciler, FakeKube]:
    kube = FakeKube()
    cronjobs = ObjectCache()
    for name, account in (("report", "reports"), ("export", "exporter")):
        body = server_defaults(gen.cronjob(name, gen.service_account(account)))
        body["metadata"]["uid"] = f"uid-{name}"
        cronjobs.put(copy.deepcopy(body))
    reconciler = HolderRbacReconciler(
        SETTINGS, Executor(kube), cronjobs, ObjectCache(), book, Readings()
    )
    return reconciler, kube


def granted_leases(kube: FakeKube) -> dict[str, list[str]]:
    return {
        name: body["rules"][0]["resourceNames"]
        for (kind, _, name), body in kube.rbac.objects.items()
        if kind == "Role"
    }


def test_a_namespace_key_writes_one_role_per_account_and_publishes_the_grants() -> None:
    book = GuardBook()
    book.record(("team-a", "report"), REPORT)
    reconciler, kube = alone(book)
    assert reconciler.reconcile(RbacKey("team-a")) == DONE
    # export is seen but not reconciled yet: granted ahead, so a burst writes Roles once.
    assert granted_leases(kube) == {
        "cronlock-holder-exporter": ["cronlock-export"],
        "cronlock-holder-reports": ["cronlock-report"],
    }
    grants = reconciler.grants("team-a")
    assert grants.granted == grants.written == {REPORT, EXPORT}
    assert grants.conflict("reports") is None


def test_a_refused_cronjob_is_granted_nothing_and_a_foreign_role_is_a_conflict() -> None:
    book = GuardBook()
    book.refuse(("team-a", "export"))
    reconciler, kube = alone(book)
    foreign = "cronlock-holder-reports"
    kube.rbac.objects[("Role", "team-a", foreign)] = {"metadata": {"name": foreign}}
    reconciler.reconcile(RbacKey("team-a"))
    assert kube.rbac.objects[("Role", "team-a", foreign)] == {"metadata": {"name": foreign}}
    assert kube.rbac.names("Role", "team-a") == [foreign], "nothing for the refused export"
    grants = reconciler.grants("team-a")
    assert grants.written == {REPORT}, "export is refused: not even a pending grant"
    assert grants.granted == frozenset(), "not in line while a Role is not cronlock's"
    conflict = grants.conflict("reports")
    assert conflict is not None
    assert "not made by cronlock" in conflict
