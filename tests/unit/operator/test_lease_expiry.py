"""The Lease expiry reconciler built alone, without the router: it reads each guarded
CronJob's lease duration, read only, from the CronJob reconciler's book."""

from __future__ import annotations

import copy

from cronlock_operator.kube.cache import ObjectCache
from cronlock_operator.reconcile.guards import GuardBook
from cronlock_operator.reconcile.keys import LeaseKey
from cronlock_operator.runtime.executor import Executor
from cronlock_operator.runtime.lease_expiry import LeaseExpiry
from cronlock_operator.runtime.workqueue import DONE
from cronlock_sidecar.lock.model import read_lease
from tests.support.cronjobs import SETTINGS
from tests.support.fakekube import FakeKube
from tests.support.leases import make_lease

LEASE = ("team-a", "cronlock-report")


def test_a_day_long_hold_is_believed_only_for_its_owners_ttl_once_it_is_known() -> None:
    """Security review L1, on the reconciler alone: a dead day-long hold seen before its
    CronJob is reconciled is believed for up to the longest any lock may have; once the
    book knows its owner's lease duration and its key is reconciled, for that one."""
    now = [1000.0]
    kube, leases, book = FakeKube(), ObjectCache(), GuardBook()
    expiry = LeaseExpiry(
        kube, SETTINGS, Executor(kube), ObjectCache(), leases, lambda: now[0], guards=book
    )
    held = make_lease(
        "squatter_12345678",
        namespace="team-a",
        duration=86400,
        owners=[("report", "uid-report")],
        resource_version="5",
    )
    kube.leases[LEASE] = copy.deepcopy(held)
    leases.put(copy.deepcopy(held))
    expiry.lease_seen(LEASE, held, read_lease(held))
    now[0] += 3600
    assert list(expiry.overdue()) == []
    book.set_lease_duration(("team-a", "report"), 60)
    assert list(expiry.overdue()) == [], "nothing changes until its key is reconciled"
    assert expiry.reconcile(LeaseKey(*LEASE)) == DONE
    assert kube.called("patch_lease"), "cleared as overdue"
    assert list(expiry.overdue()) == [LEASE]
