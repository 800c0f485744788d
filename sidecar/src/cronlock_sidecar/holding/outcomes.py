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
    """We hold the Lease; `transitions` is the fencing token."""

    lease: LeaseRef
    holder: str
    transitions: int
    acquire_time: str
    resumed: bool
    reason: str


class Busy(NamedTuple):
    """A live holder has the Lease, or (`clearing`) an expired one that only the operator
    may clear: the holders' admission policy refused our takeover.

    `acquired_at` and `yield_to` are what a replace run decides on (is the holder older
    than us, has a newer run asked it to yield); `why` is set once the run gives up for a
    reason of its own: "replaced" (our Job's run was replaced, this is its retry),
    "superseded" (a newer replace run came), "not yielded" (the holder did not yield in
    time), "frozen" (`cronlock freeze`: `other` says until when, by whom and why),
    "already ran" (another run claimed our tick or a later one: `tick` is ours, `record`
    the lock's, `other` its `who()`); a `why` ends the run under every policy.
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

    @property
    def already_ran(self) -> bool:
        return self.why == ALREADY_RAN and self.tick is not None and self.record is not None

    def message(self) -> str:
        if self.why == ALREADY_RAN and self.tick is not None and self.record is not None:
            return skip_line(self.tick, self.record, str(self.lease))
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
