"""What the Lease protocol answers (acquired, busy, renew outcomes) and the clocks it runs on."""

from __future__ import annotations

import enum
import time
from datetime import UTC, datetime
from typing import NamedTuple, Protocol

from cronlock_sidecar.contract import ALREADY_RAN
from cronlock_sidecar.lock.ticks import Tick, TickRecord, skip_line
from cronlock_sidecar.transport.seam import LeaseRef


class Clock(Protocol):
    """Monotonic time for our own deadlines, wall time for what we write into the Lease."""

    def monotonic(self) -> float: ...

    def now(self) -> datetime: ...


class SystemClock:
    """The real clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)


# The records below are NamedTuples, not dataclasses: importing dataclasses (with inspect
# and ast) is a visible part of a short `run`'s start-up (tests/unit/sidecar/
# test_startup_imports.py keeps it out). They are immutable as before.
class Acquired(NamedTuple):
    """We hold permit `permit` of the lock (0: the Lease's own spec, the only one of a lock
    of one permit); `transitions` is that permit's fencing token."""

    lease: LeaseRef
    holder: str
    transitions: int
    acquire_time: str
    resumed: bool
    reason: str
    permit: int = 0


class Busy(NamedTuple):
    """A live holder has the Lease, or (`clearing`) an expired one that only the operator
    may clear: the holders' admission policy refused our takeover.

    `acquired_at` and `yield_to` are what a replace run decides on (is the holder older
    than us, has a newer run asked it to yield); `why` is set once the run gives up for a
    reason of its own: "replaced" (our Job's run was replaced, this is its retry),
    "superseded" (a newer replace run came), "not yielded" (the holder did not yield in
    time), "frozen" (`cronlock freeze`: `other` says until when, by whom and why),
    "already ran" (another run claimed our tick or a later one: `tick` is ours, `record`
    the lock's, `other` its `who()`), "replace with permits" (policy replace asks no holder
    of a lock of N > 1 permits to yield); a `why` ends the run under every policy.

    `permits`: on a lock of N > 1 permits, all held, each permit's holder by its number
    (`holder` is then the one whose hold ends first).
    """

    lease: LeaseRef
    holder: str
    renewed_ago: float
    expires_in: float
    clearing: bool = False
    acquired_at: datetime | None = None
    yield_to: str = ""
    why: str = ""
    other: str = ""  # the run `why` is about
    tick: Tick | None = None
    record: TickRecord | None = None
    permits: tuple[str, ...] = ()

    @property
    def already_ran(self) -> bool:
        return self.why == ALREADY_RAN and self.tick is not None and self.record is not None

    def message(self) -> str:
        if self.why == ALREADY_RAN and self.tick is not None and self.record is not None:
            return skip_line(self.tick, self.record, str(self.lease))
        if self.permits and not self.clearing and self.why in ("", "replace with permits"):
            held = ", ".join(
                f"{holder} (permit {number})" for number, holder in enumerate(self.permits)
            )
            line = f"all {len(self.permits)} permits of lock {self.lease} are held: {held}"
            if self.why:
                return (
                    f"{line}; policy replace asks no holder to yield on a lock of more than "
                    "one permit (not supported yet); skipping this run"
                )
            return f"{line}; skipping this run"
        if self.why == "frozen":
            return f"lock frozen: lease {self.lease} {self.other}; skipping this run"
        if self.why == "replaced":
            return (
                f"this Job's run was replaced by {self.other or 'a newer run'} on lease "
                f"{self.lease}; its retry skips instead of replacing that run"
            )
        if self.why == "superseded" and self.other == self.holder:
            return (
                f"lease {self.lease} held by a newer run, {self.holder}: it took the lease "
                "after this run started (replace policy: the newest run wins); skipping this run"
            )
        if self.why == "superseded":
            return (
                f"lease {self.lease}: a newer run ({self.other}) replaces {self.holder} "
                "instead of this one (replace policy: the newest run wins); skipping this run"
            )
        if self.why == "not yielded":
            return (
                f"already running: lease {self.lease} held by {self.holder}, which did not "
                f"yield within the wait timeout (replace policy); skipping this run"
            )
        if self.clearing:
            return (
                f"already running: lease {self.lease} held by {self.holder}, not renewed for "
                f"{max(0, round(self.renewed_ago))}s; the holders' admission policy leaves "
                "clearing it to the operator, which has not yet; skipping this run"
            )
        return (
            f"already running: lease {self.lease} held by {self.holder} "
            f"(renewed {max(0, round(self.renewed_ago))}s ago, "
            f"expires in {max(0, round(self.expires_in))}s); skipping this run"
        )


class RenewOutcome(enum.Enum):
    RENEWED = "renewed"
    FAILED = "failed"
    LOST = "lost"


class RenewResult(NamedTuple):
    outcome: RenewOutcome
    detail: str = ""


class PermitsDisagree(Exception):
    """The lock's document says another number of permits than the run requires
    (`run --permits N`): a configuration error, never retried."""

    def __init__(self, lease: LeaseRef, found: str, wanted: int) -> None:
        super().__init__(
            f"lease {lease} says {found!r} permits (cronlock.io/permits) but this run requires "
            f"{wanted} (--permits): every run sharing a lock must give the same number; "
            f"use --permits {found.strip()} or another lock"
        )
        self.lease = lease
        self.found = found
        self.wanted = wanted
