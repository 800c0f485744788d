"""The Lease reconciler: notice holders that stopped renewing, and clear them, decided purely.

Expiry is judged on the operator's own monotonic clock (how long since it last saw the
Lease change), never by comparing the holder's wall clock with ours: a holder whose
renewals stopped reaching the API server for longer than its duration plus the skew is
cleared with a guarded patch, so the next run need not wait for the TTL itself. A lock of
N permits (sidecar lock/permits.py) has one such holder per permit: the spec's, and each
entry `cronlock.io/permit.K`'s, observed and cleared alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cronlock_operator.reconcile.actions import (
    Action,
    CountRun,
    CountTakeover,
    PatchLease,
    PostEvent,
)
from cronlock_sidecar import contract
from cronlock_sidecar.lock.model import LeaseRecord, cleared, read_lease
from cronlock_sidecar.lock.permits import Permit, cleared_permit, read_permits
from cronlock_sidecar.microtime import format_microtime


@dataclass(frozen=True)
class Observation:
    """A Lease's holder as last seen, timed on the operator's own monotonic clock."""

    holder: str
    renew_time: str | None
    duration: int
    transitions: int
    seen_at: float

    def overdue(self, now: float, skew_seconds: float) -> bool:
        """Held, and unchanged for longer than its duration plus the skew."""
        return bool(self.holder) and now - self.seen_at > self.duration + skew_seconds


def observe(
    previous: Observation | None, record: LeaseRecord, now: float, longest_duration: int
) -> tuple[Observation | None, list[Action]]:
    """A new Observation when the holder or renew time changed (None: unchanged), and what
    the change counts as: a new holder is an acquired run, a cleared one a released run.

    The holder writes the Lease's duration itself, so it is believed only up to
    `longest_duration`, the longest its lock's owners give it: a hold written to last 68
    years is cleared like any other once its renewals stop."""
    if previous is not None and (previous.holder, previous.renew_time) == (
        record.holder,
        record.renew_time_text,
    ):
        return None, []
    counts: list[Action] = []
    if previous is not None and record.holder and record.transitions > previous.transitions:
        counts.append(CountRun("acquired"))
    if previous is not None and previous.holder and not record.holder:
        counts.append(CountRun("released"))
    seen = Observation(
        record.holder,
        record.renew_time_text,
        min(record.duration_seconds or contract.DEFAULT_TTL_SECONDS, longest_duration),
        record.transitions,
        now,
    )
    return seen, counts


def decide(
    seen: Observation,
    lease: Mapping[str, Any],
    owners: Sequence[Mapping[str, Any]],
    now: float,
    wall_now: datetime,
) -> list[Action]:
    """Clear the holder of `lease` (as just read) if it is still the one seen, unrenewed.

    `owners` are the cached CronJobs that own the Lease; each gets a `LeaseExpired` Event,
    but only once the guarded patch went through (it stops the list otherwise).
    """
    record = read_lease(lease)
    if (record.holder, record.renew_time_text) != (seen.holder, seen.renew_time):
        return []  # it renewed (or changed hands) after all; the next event updates us
    message = (
        f"lease {record.namespace}/{record.name} held by {seen.holder} was not renewed for "
        f"{now - seen.seen_at:.0f}s (duration {seen.duration}s); cleared so the next run can "
        "start"
    )
    return [
        PatchLease(record.namespace, record.name, cleared(lease, seen.holder, wall_now)),
        CountTakeover(record.namespace, contract.lock_of(record.name, record.lock), "expired"),
        CountRun("lost"),
        *(PostEvent(cronjob, "LeaseExpired", message, warning=True) for cronjob in owners),
    ]


def _renew_text(permit: Permit) -> str | None:
    return format_microtime(permit.renew_time) if permit.renew_time else None


def observe_permits(
    previous: Mapping[int, Observation],
    lease: Mapping[str, Any],
    now: float,
    longest_duration: int,
) -> tuple[dict[int, Observation], list[Action]]:
    """`observe` for each permit entry K ≥ 1 of the lock's N: every entry's Observation
    (the previous one where its holder and renew time are unchanged), and what the changes
    count as. An entry at or beyond N is nobody's permit and is not observed."""
    seen: dict[int, Observation] = {}
    counts: list[Action] = []
    for permit in read_permits(lease)[1:]:
        before = previous.get(permit.number)
        renew_text = _renew_text(permit)
        if before is not None and (before.holder, before.renew_time) == (
            permit.holder,
            renew_text,
        ):
            seen[permit.number] = before
            continue
        if before is not None and permit.holder and permit.transitions > before.transitions:
            counts.append(CountRun("acquired"))
        if before is not None and before.holder and not permit.holder:
            counts.append(CountRun("released"))
        seen[permit.number] = Observation(
            permit.holder,
            renew_text,
            min(permit.duration_seconds or contract.DEFAULT_TTL_SECONDS, longest_duration),
            permit.transitions,
            now,
        )
    return seen, counts


def decide_permit(
    seen: Observation,
    index: int,
    lease: Mapping[str, Any],
    owners: Sequence[Mapping[str, Any]],
    now: float,
    wall_now: datetime,
) -> list[Action]:
    """`decide` for permit entry `index`: clear its holder if still the one seen, unrenewed,
    with the same `LeaseExpired` Event and counts as an expired spec holder."""
    record = read_lease(lease)
    entries = read_permits(lease)
    if index >= len(entries):
        return []  # N was lowered: no permit any more, nobody's to clear
    permit = entries[index]
    if (permit.holder, _renew_text(permit)) != (seen.holder, seen.renew_time):
        return []
    message = (
        f"lease {record.namespace}/{record.name} permit {index} held by {seen.holder} was not "
        f"renewed for {now - seen.seen_at:.0f}s (duration {seen.duration}s); cleared so the "
        "next run can start"
    )
    return [
        PatchLease(
            record.namespace, record.name, cleared_permit(lease, index, seen.holder, wall_now)
        ),
        CountTakeover(record.namespace, contract.lock_of(record.name, record.lock), "expired"),
        CountRun("lost"),
        *(PostEvent(cronjob, "LeaseExpired", message, warning=True) for cronjob in owners),
    ]
