"""The CronJob reconciler built alone, without the router: it meets the holder RBAC and
the Lease expiry reconcilers only through the keys it asks for and the grants it reads."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from cronlock_operator.cronjob.reading import Readings
from cronlock_operator.injection.build import is_injected
from cronlock_operator.kube.cache import ObjectCache
from cronlock_operator.reconcile.keys import CronJobKey, Key, LeaseKey, RbacKey
from cronlock_operator.reconcile.rbac import Guard, HolderGrants
from cronlock_operator.runtime.cronjobs import CONFLICT_RECHECK, CronJobReconciler
from cronlock_operator.runtime.executor import Executor
from cronlock_operator.runtime.workqueue import DONE, Result
from tests.support import gen
from tests.support.cronjobs import SETTINGS, server_defaults
from tests.support.fakekube import FakeKube

REPORT = Guard("cronlock-report", "reports")
KEY = CronJobKey("team-a", "report")


@dataclass
class Grants:
    """What the holder RBAC reconciler would publish, set by the test."""

    now: HolderGrants = field(default_factory=HolderGrants)

    def grants(self, namespace: str) -> HolderGrants:
        assert namespace == "team-a"
        return self.now


def alone() -> tuple[CronJobReconciler, FakeKube, Grants, list[Key]]:
    kube = FakeKube()
    cronjobs = ObjectCache()
    body = server_defaults(gen.cronjob("report", gen.service_account("reports")))
    body["metadata"]["uid"] = "uid-report"
    kube.cronjobs[("team-a", "report")] = copy.deepcopy(body)
    cronjobs.put(body)
    grants, asked = Grants(), []
    reconciler = CronJobReconciler(
        SETTINGS,
        Executor(kube),
        cronjobs,
        ObjectCache(),
        grants=grants,
        enqueue=asked.append,
        readings=Readings(),
    )
    return reconciler, kube, grants, asked


def test_a_new_cronjob_makes_its_lease_and_waits_for_its_holder_role_before_the_patch() -> None:
    reconciler, kube, _, asked = alone()
    assert reconciler.reconcile(KEY) == DONE
    assert ("team-a", "cronlock-report") in kube.leases, "the Lease first"
    assert kube.called("patch_cronjob") == [], "no run may start before its Role is written"
    assert asked == [LeaseKey("team-a", "cronlock-report"), RbacKey("team-a")]
    assert reconciler.waiting("team-a") == {("team-a", "report")}
    # What the holder RBAC reconciler reads of it, read only.
    assert reconciler.book.in_namespace("team-a") == {REPORT}
    assert reconciler.book.lease_duration(("team-a", "report")) is not None


def test_once_its_role_is_written_the_cronjob_is_injected_without_asking_again() -> None:
    reconciler, kube, grants, asked = alone()
    reconciler.reconcile(KEY)
    grants.now = HolderGrants(granted=frozenset({REPORT}), written=frozenset({REPORT}))
    asked.clear()
    assert reconciler.reconcile(KEY) == DONE
    assert is_injected(kube.cronjobs[("team-a", "report")])
    assert kube.reasons() == ["Injected"]
    assert RbacKey("team-a") not in asked
    assert reconciler.waiting("team-a") == frozenset()


def test_a_role_that_is_not_cronlocks_refuses_it_once_and_looks_again_later() -> None:
    reconciler, kube, grants, _ = alone()
    reconciler.reconcile(KEY)
    grants.now = HolderGrants(
        written=frozenset({REPORT}),
        conflicts={"cronlock-holder-reports": "Role team-a/cronlock-holder-reports exists"},
    )
    for _ in range(2):
        assert reconciler.reconcile(KEY) == Result(requeue_after=CONFLICT_RECHECK)
    assert kube.reasons() == ["Conflict"]
    assert kube.called("patch_cronjob") == []
    assert reconciler.refused() == {("team-a", "report")}
    assert reconciler.book.in_namespace("team-a") == frozenset(), "granted to nobody"
