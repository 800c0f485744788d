"""The schedule's warnings: a lock's ttl, or its jitter, against the shortest gap between
two of its CronJob's ticks (the schedule parser itself is the sidecar's,
`cronlock_sidecar.lock.schedule`)."""

from __future__ import annotations

from cronlock_operator.cronjob.config import LockConfig
from cronlock_sidecar.lock.durations import format_duration
from cronlock_sidecar.lock.schedule import min_gap_seconds


def ttl_longer_than_gap_warning(config: LockConfig, schedule: str) -> str | None:
    """A warning for the CronJob when a dead run could block more than one later run."""
    gap = min_gap_seconds(schedule)
    if gap is None or config.ttl_seconds <= gap:
        return None
    return (
        f"ttl {format_duration(config.ttl_seconds)} is longer than the shortest gap between "
        f"two runs of the schedule {schedule!r} ({format_duration(gap)}): a run that dies "
        "holding the lock could block more than one later run; consider a shorter cronlock.io/ttl"
    )


def jitter_not_shorter_than_gap_warning(config: LockConfig, schedule: str) -> str | None:
    """A warning for the CronJob when a run's jitter can delay it past its next tick."""
    gap = min_gap_seconds(schedule)
    if gap is None or config.jitter_seconds == 0 or config.jitter_seconds < gap:
        return None
    return (
        f"jitter {format_duration(config.jitter_seconds)} is not shorter than the shortest gap "
        f"between two runs of the schedule {schedule!r} ({format_duration(gap)}): a run could "
        "start after the next tick's, and the two overlap or skip; consider a "
        "cronlock.io/jitter shorter than the gap"
    )
