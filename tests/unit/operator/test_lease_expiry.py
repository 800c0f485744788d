"""The Lease expiry reconciler built alone, without the router: it reads each guarded
CronJob's lease duration, read only, from the CronJob reconciler's book."""

from __future__ import annotations

import copy
import datetime
from typing import Any

from cronlock_operator.kube.cache import ObjectCache
from cronlock_operator.reconcile.guards import GuardBook
from cronlock_operator.reconcile.keys import LeaseKey
from cronlock_operator.runtime import metrics
from cronlock_operator.runtime.executor import Executor
from cronlock_operator.runtime.lease_expiry import LeaseExpiry
from cronlock_operator.runtime.reconciler import Reconciler
from cronlock_operator.runtime.workqueue import DONE
from cronlock_sidecar.lock import permits
from cronlock_sidecar.lock.model import Timing, read_lease
from tests.support import gen
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


def test_an_expired_permit_is_cleared_like_an_expired_spec_holder_and_a_renewed_one_kept() -> None:
    """A lock of 3 permits: permit 1's holder renews, permit 2's stopped. Once permit 2 is
    unchanged for longer than its duration plus the skew, the operator clears it (its
    transitions kept, the release on record), with the same LeaseExpired Event and counts
    as for the spec's holder; permit 1, renewed, stays."""
    now = [1000.0]
    kube, leases, cronjobs = FakeKube(), ObjectCache(), ObjectCache()
    cronjobs.put(gen.cronjob("report", gen.with_uid("uid-report")))
    expiry = LeaseExpiry(
        kube, SETTINGS, Executor(kube), cronjobs, leases, lambda: now[0], guards=GuardBook()
    )
    wall = datetime.datetime(2026, 12, 6, 12, 0, tzinfo=datetime.UTC)
    timing = Timing.of(60)
    body: dict[str, Any] = make_lease(
        namespace="team-a",
        owners=[("report", "uid-report")],
        annotations={"cronlock.io/permits": "3"},
        resource_version="5",
    )
    body = permits.claimed_permit(body, 1, "alive_12345678", timing, wall, "report-1")
    body = permits.claimed_permit(body, 2, "dead_87654321", timing, wall, "report-2")

    def seen(lease: dict[str, Any]) -> None:
        kube.leases[LEASE] = copy.deepcopy(lease)
        leases.put(copy.deepcopy(lease))
        expiry.lease_seen(LEASE, lease, read_lease(lease))

    seen(body)
    assert list(expiry.overdue()) == []
    now[0] += 40
    seen(permits.renewed_permit(body, 1, timing, wall + datetime.timedelta(seconds=40)))
    now[0] += 25  # permit 2: 65 s unchanged, over its 60 s and the 2 s skew
    assert list(expiry.overdue()) == [LEASE]
    assert expiry.reconcile(LeaseKey(*LEASE)) == DONE
    [patch] = [call[1][2] for call in kube.calls if call[0] == "patch_lease"]
    assert patch[1]["path"] == "/metadata/annotations/cronlock.io~1permit.2"
    stored = permits.read_permits(kube.leases[LEASE])
    assert (stored[2].holder, stored[2].transitions) == ("", 1)
    assert stored[1].holder == "alive_12345678"
    assert kube.leases[LEASE]["metadata"]["annotations"]["cronlock.io/last-holder"] == (
        "dead_87654321"
    )
    [(name, reason, message, warning)] = kube.events
    assert (name, reason, warning) == ("report", "LeaseExpired", True)
    assert "permit 2 held by dead_87654321 was not renewed for 65s" in message
    # The cleared permit seen free: nothing is overdue any more.
    seen(kube.leases[LEASE])
    assert list(expiry.overdue()) == []


def test_a_permit_renewed_after_all_or_beyond_a_lowered_n_is_not_cleared() -> None:
    now = [1000.0]
    kube, leases = FakeKube(), ObjectCache()
    expiry = LeaseExpiry(
        kube, SETTINGS, Executor(kube), ObjectCache(), leases, lambda: now[0], guards=GuardBook()
    )
    wall = datetime.datetime(2026, 12, 6, 12, 0, tzinfo=datetime.UTC)
    body: dict[str, Any] = make_lease(
        namespace="team-a", annotations={"cronlock.io/permits": "2"}, resource_version="5"
    )
    body = permits.claimed_permit(body, 1, "late_12345678", Timing.of(60), wall, "report-1")
    leases.put(copy.deepcopy(body))
    expiry.lease_seen(LEASE, body, read_lease(body))
    now[0] += 70
    # Read fresh at the reconcile: renewed meanwhile (its watch event not seen yet).
    kube.leases[LEASE] = permits.renewed_permit(
        body, 1, Timing.of(60), wall + datetime.timedelta(seconds=50)
    )
    assert expiry.reconcile(LeaseKey(*LEASE)) == DONE
    # N lowered to 1 meanwhile: permit 1 is nobody's, not cleared.
    lowered = copy.deepcopy(body)
    lowered["metadata"]["annotations"]["cronlock.io/permits"] = "1"
    kube.leases[LEASE] = lowered
    assert expiry.reconcile(LeaseKey(*LEASE)) == DONE
    assert not kube.called("patch_lease")
    assert kube.events == []


def _pod(name: str, uid: str, job: tuple[str, str] | None = None) -> dict[str, Any]:
    owners = (
        [] if job is None else [{"kind": "Job", "name": job[0], "uid": job[1], "controller": True}]
    )
    return {
        "metadata": {"name": name, "namespace": "team-a", "uid": uid, "ownerReferences": owners},
        "spec": {"serviceAccountName": "shared"},
    }


def test_a_permit_taken_by_a_pod_that_is_no_run_is_cleared_and_a_runs_permit_kept() -> None:
    """Security review N4 for a lock of N permits: a pod on the runs' account may claim a
    free entry in its own name; unless it is a run of the lock, the operator clears it with
    the ForeignHolder Warning as it clears such a spec hold. A run's entry is vetted once."""
    kube, leases, cronjobs = FakeKube(), ObjectCache(), ObjectCache()
    cronjobs.put(gen.cronjob("report", gen.with_uid("uid-report")))
    expiry = LeaseExpiry(
        kube, SETTINGS, Executor(kube), cronjobs, leases, lambda: 1000.0, guards=GuardBook()
    )
    kube.pods[("team-a", "report-1-abcde")] = _pod(
        "report-1-abcde", "11112222-x", ("report-1", "uid-job")
    )
    kube.jobs[("team-a", "report-1")] = {
        "metadata": {
            "name": "report-1",
            "uid": "uid-job",
            "ownerReferences": [{"kind": "CronJob", "name": "report", "uid": "uid-report"}],
        }
    }
    kube.pods[("team-a", "webapp")] = _pod("webapp", "33334444-y")
    wall = datetime.datetime.now(datetime.UTC)
    body: dict[str, Any] = make_lease(
        namespace="team-a",
        owners=[("report", "uid-report")],
        annotations={"cronlock.io/permits": "3"},
        resource_version="5",
    )
    body = permits.claimed_permit(
        body, 1, "report-1-abcde_11112222", Timing.of(60), wall, "report-1"
    )
    body = permits.claimed_permit(body, 2, "webapp_33334444", Timing.of(60), wall, "")
    kube.leases[LEASE] = copy.deepcopy(body)
    leases.put(copy.deepcopy(body))
    assert expiry.lease_seen(LEASE, body, read_lease(body)), "new holders are due a look"
    assert expiry.reconcile(LeaseKey(*LEASE)) == DONE
    stored = permits.read_permits(kube.leases[LEASE])
    assert (stored[1].holder, stored[2].holder) == ("report-1-abcde_11112222", "")
    [(name, reason, message, warning)] = kube.events
    assert (name, reason, warning) == ("report", "ForeignHolder", True)
    assert "permit 2 was claimed by webapp_33334444: pod webapp" in message
    assert "it is owned by no Job" in message
    # The run's permit was vetted: seen again, it is not looked at again.
    again = kube.leases[LEASE]
    reads = len(kube.called("read_pod"))
    assert not expiry.lease_seen(LEASE, again, read_lease(again))
    assert expiry.reconcile(LeaseKey(*LEASE)) == DONE
    assert len(kube.called("read_pod")) == reads


def test_a_lock_of_permits_is_held_while_any_permit_is() -> None:
    """cronlock_lease_held: 1 while the lock has a holder, on a lock of N of any permit."""
    reconciler = Reconciler(kube=FakeKube(), settings=SETTINGS)

    def held(lease: dict[str, Any]) -> float | None:
        reconciler.on_lease("MODIFIED", lease)
        return metrics.registry.get_sample_value(
            "cronlock_lease_held", {"namespace": "team-a", "lock": "report"}
        )

    wall = datetime.datetime.now(datetime.UTC)
    free = make_lease(namespace="team-a", annotations={"cronlock.io/permits": "2"})
    assert held(free) == 0
    entry = permits.claimed_permit(free, 1, "report-1-abcde_12345678", Timing.of(60), wall, "")
    assert held(entry) == 1
    assert held(permits.released_permit(entry, 1, "report-1-abcde_12345678", wall)) == 0
    # An entry beyond the lock's N is nobody's permit.
    lowered = copy.deepcopy(entry)
    lowered["metadata"]["annotations"]["cronlock.io/permits"] = "1"
    assert held(lowered) == 0
