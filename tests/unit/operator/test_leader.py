"""Leader election on the lock model, with a fake clock and a fake Lease API: who leads,
when a silent leader is replaced, and timing refused as client-go refuses it."""

from __future__ import annotations

import copy
import datetime
import json
from typing import Any

import kubernetes
import pytest

from cronlock_operator.kube.errors import Retry
from cronlock_operator.kube.leaderlease import LeaderLeases
from cronlock_operator.runtime.leader import TIMING, Elector
from cronlock_sidecar.lock.model import Timing, TimingError, read_lease

NAMESPACE, NAME = "cronlock-system", "cronlock-leader"


class Answer:
    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()

    def release_conn(self) -> None:
        pass


class FakeLeases:
    """One Lease in memory; a write of a stale resourceVersion is a 409, as the API's."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.writes = 0

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> Answer:
        if self.lease is None:
            raise kubernetes.client.ApiException(status=404)
        return Answer(self.lease)

    def create_namespaced_lease(self, namespace: str, body: dict[str, Any], **_: Any) -> Answer:
        if self.lease is not None:
            raise kubernetes.client.ApiException(status=409)
        return self._store(body)

    def replace_namespaced_lease(
        self, name: str, namespace: str, body: dict[str, Any], **_: Any
    ) -> Answer:
        assert self.lease is not None
        if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise kubernetes.client.ApiException(status=409)
        return self._store(body)

    def _store(self, body: dict[str, Any]) -> Answer:
        self.version += 1
        self.writes += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return Answer(self.lease)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.wall = datetime.datetime(2026, 12, 2, 4, 0, tzinfo=datetime.UTC)

    def monotonic(self) -> float:
        return self.now

    def utc(self) -> datetime.datetime:
        return self.wall + datetime.timedelta(seconds=self.now - 1000.0)


def elector(leases: FakeLeases, clock: Clock, me: str, timing: Timing = TIMING) -> Elector:
    # The real edge (kube/leaderlease.py) over a fake client: its 404, 409 and failures.
    return Elector(
        LeaderLeases(leases=leases),
        NAMESPACE,
        NAME,
        me,
        clock.monotonic,
        timing=timing,
        wall=clock.utc,
    )


def test_the_first_replica_creates_the_lease_and_leads_the_second_waits() -> None:
    leases, clock = FakeLeases(), Clock()
    first, second = elector(leases, clock, "a_1"), elector(leases, clock, "b_2")
    assert first.try_acquire() == "a_1"
    assert second.try_acquire() == "a_1"
    record = read_lease(leases.lease or {})
    assert (record.holder, record.duration_seconds, record.transitions) == ("a_1", 15, 1)
    assert record.managed


def test_a_renewing_leader_is_never_replaced_and_a_silent_one_is_after_duration_plus_skew() -> None:
    leases, clock = FakeLeases(), Clock()
    first, second = elector(leases, clock, "a_1"), elector(leases, clock, "b_2")
    first.try_acquire()
    for _ in range(20):  # 40 s of renewals every 2 s
        clock.now += 2
        assert first.try_acquire() == "a_1"
        assert second.try_acquire() == "a_1"
    # The leader stops renewing: its hold is judged on the waiting replica's own clock.
    second.try_acquire()
    clock.now += 15 + 2  # duration plus skew, not more
    assert second.try_acquire() == "a_1"
    clock.now += 0.5
    assert second.try_acquire() == "b_2"
    record = read_lease(leases.lease or {})
    assert (record.holder, record.transitions) == ("b_2", 2)
    # The old leader, back, finds another holder and its own renew deadline long past.
    assert not first.renew_once()


def test_a_released_lead_is_taken_at_once_and_of_two_takers_the_later_write_conflicts() -> None:
    leases, clock = FakeLeases(), Clock()
    first, second, third = (elector(leases, clock, me) for me in ("a_1", "b_2", "c_3"))
    first.try_acquire()
    first.release()
    released = read_lease(leases.lease or {})
    assert (released.holder, released.last_holder) == ("", "a_1")
    write = leases.replace_namespaced_lease

    def third_writes_first(*args: Any, **kwargs: Any) -> Answer:
        leases.replace_namespaced_lease = write  # type: ignore[method-assign]
        assert third.try_acquire() == "c_3"  # between second's read and its write
        return write(*args, **kwargs)

    leases.replace_namespaced_lease = third_writes_first  # type: ignore[method-assign]
    assert second.try_acquire() == "", "a 409 is a look again, not a lead"
    assert read_lease(leases.lease or {}).holder == "c_3"
    assert second.try_acquire() == "c_3"


def test_a_leader_that_cannot_renew_gives_up_at_the_renew_deadline() -> None:
    leases, clock = FakeLeases(), Clock()
    leading = elector(leases, clock, "a_1")
    leading.try_acquire()

    def unreachable(*_: Any, **__: Any) -> Answer:
        raise OSError("connection refused")

    leases.read_namespaced_lease = unreachable  # type: ignore[method-assign]
    clock.now += TIMING.renew_deadline
    assert leading.renew_once(), "exactly at the deadline it still leads"
    clock.now += 0.1
    assert not leading.renew_once()


@pytest.mark.parametrize(
    "timing",
    [Timing.of(15, 6, 2), Timing.of(15, 0, 2), Timing.of(0.5, 0.1, 2), Timing.of(15, 2, -1)],
    ids=["renew-over-a-third", "no-renew", "too-short", "negative-skew"],
)
def test_timing_that_cannot_hold_a_lead_is_refused_before_anything_is_written(
    timing: Timing,
) -> None:
    leases = FakeLeases()
    with pytest.raises(TimingError):
        elector(leases, Clock(), "a_1", timing)
    assert leases.writes == 0


def test_the_edge_turns_a_refusal_into_retry_and_reads_absent_and_conflict_as_values() -> None:
    leases = FakeLeases()
    edge = LeaderLeases(leases=leases)
    assert edge.read(NAMESPACE, NAME) is None  # 404
    body = {"metadata": {"name": NAME, "namespace": NAMESPACE}, "spec": {}}
    assert edge.create(NAMESPACE, body) is True
    assert edge.create(NAMESPACE, body) is False  # 409: it exists
    stale = {"metadata": {"name": NAME, "resourceVersion": "0"}, "spec": {}}
    assert edge.replace(NAMESPACE, NAME, stale) is False  # 409: changed since read

    def forbidden(*_: Any, **__: Any) -> Answer:
        raise kubernetes.client.ApiException(status=403, reason="Forbidden")

    leases.read_namespaced_lease = forbidden  # type: ignore[method-assign]
    with pytest.raises(Retry, match="HTTP 403 Forbidden"):
        edge.read(NAMESPACE, NAME)
