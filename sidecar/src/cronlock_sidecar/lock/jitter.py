"""Jitter: a run's work starts (its lock is taken) up to D after its start, uniformly.

A hundred CronJobs on `0 * * * *` would otherwise reach one database in the same second
(docs/USAGE.md, "Jitter"). The offset is uniform over [0, D). For a tick's run it is the
same wherever and whenever a pod of that tick computes it: the first 8 bytes of SHA-256
of `<cronjob> <tick>` (the CronJob's name as lock/ticks.py names it, the tick in RFC
3339) as a fraction of 2**64 (to a double's 53 bits), times D. The run starts at the
tick's nominal time plus the offset, so a pod that started late has used part of its
delay already and a retry pod of the same tick waits for the same instant (Temporal's
schedule jitter is deterministic per nominal time in the same way). A manual run has no
tick: its offset is drawn from the OS's random source (os.urandom, what `secrets` reads)
and counted from the run's own start.

Standard library only, and hashlib only when a tick is jittered: it is off a short `run`'s
start-up path otherwise (tests/unit/sidecar/test_startup_imports.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import NamedTuple

from cronlock_sidecar.lock.durations import format_duration
from cronlock_sidecar.lock.ticks import format_tick

# The first 8 bytes' top 53 bits, a double's precision: a fraction below 1, exactly.
_BITS = 53
_SCALE = 1 << _BITS


class Jitter(NamedTuple):
    """When a run's work starts: `start` (UTC) is the tick's nominal time, or the run's own
    start for a manual run, `offset` the seconds after it, `wait` how long from `now` that
    still is (0 when the instant has passed), `tick` what the offset was drawn for."""

    start: datetime
    offset: float
    wait: float
    bound: float
    tick: str = ""
    cronjob: str = ""

    @property
    def starts_at(self) -> datetime:
        return self.start + timedelta(seconds=self.offset)

    def line(self) -> str:
        """The one info line: when the run starts, why then, and the bound."""
        at = self.starts_at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        drawn = (
            f"tick {self.tick} of {self.cronjob}, offset {self.offset:.3f}s"
            if self.tick
            else f"a manual run, random offset {self.offset:.3f}s"
        )
        return (
            f"jitter: the run starts in {self.wait:.1f}s, at {at} ({drawn}, up to "
            f"{format_duration(self.bound)})"
        )


def tick_offset(cronjob: str, at: datetime, bound: float) -> float:
    """The offset in [0, bound) of the tick (`cronjob`, `at`): the same for every pod."""
    import hashlib

    digest = hashlib.sha256(f"{cronjob} {format_tick(at)}".encode()).digest()
    return (int.from_bytes(digest[:8], "big") >> (64 - _BITS)) / _SCALE * bound


def random_offset(bound: float, urandom: Callable[[int], bytes] = os.urandom) -> float:
    """A fresh offset in [0, bound), uniform, from the OS's random source."""
    drawn: bytes = urandom(8)
    return (int.from_bytes(drawn, "big") >> (64 - _BITS)) / _SCALE * bound


def jitter_of(
    bound: float,
    now: datetime,
    tick: tuple[str, datetime] | None,
    urandom: Callable[[int], bytes] = os.urandom,
) -> Jitter:
    """When a run that starts `now` (UTC) begins its work under a jitter of `bound` seconds:
    from its tick (`(cronjob, nominal time)`) or, for a manual run (None), at random."""
    if tick is None:
        offset = random_offset(bound, urandom)
        return Jitter(now, offset, offset, bound)
    cronjob, at = tick
    offset = tick_offset(cronjob, at, bound)
    wait = max(0.0, (at + timedelta(seconds=offset) - now).total_seconds())
    return Jitter(at, offset, wait, bound, format_tick(at), cronjob)
