"""`max-hold`: the longest a run may hold its lock, and the bounds a value must keep.

The bound counts from the acquire (the decision "run"): what it limits is how long the lock
is kept from the other runs, and a run waiting for the lock holds nothing yet. One rule
for the operator (cronlock.io/max-hold) and the sidecar (--max-hold), so they cannot drift.
"""

from __future__ import annotations

from cronlock_sidecar.contract import MAX_HOLD_EXCEEDED
from cronlock_sidecar.lock.durations import format_duration
from cronlock_sidecar.lock.model import Timing

# A week: longer is no bound on a scheduled run, and a typo (7000h for 70h) is refused.
MAX_HOLD_LONGEST_SECONDS = 7 * 24 * 3600.0
# At least this many renew periods: a shorter bound would stop a run before its sidecar
# renewed the Lease twice, closer to the lock's own heartbeat than a run lasts; such a value
# is surely a slip (5s for 5m), and the stop could not be told from a lost Lease.
MAX_HOLD_RENEWALS = 2


def shortest_max_hold(timing: Timing) -> float:
    """The shortest bound this timing admits: MAX_HOLD_RENEWALS renew periods."""
    return MAX_HOLD_RENEWALS * timing.renew_ms / 1000


def max_hold_problem(seconds: float, timing: Timing, policy: str) -> str | None:
    """Why `seconds` (0: no bound) cannot be a run's max-hold with this timing and policy,
    as the end of a sentence naming the value; None when it can."""
    if seconds == 0:
        return None
    if policy == "observe":
        return (
            'cannot be used with policy "observe", which never stops a run; use another '
            "policy or remove the max-hold"
        )
    if seconds > MAX_HOLD_LONGEST_SECONDS:
        return "is out of range; expected at most 168h (7 days), or 0 for no bound"
    shortest = shortest_max_hold(timing)
    if seconds < shortest:
        return (
            f"is shorter than {MAX_HOLD_RENEWALS} renew periods ({format_duration(shortest)} "
            f"with a renew period of {format_duration(timing.renew_ms / 1000)}); expected at "
            f"least {format_duration(shortest)}, or 0 for no bound"
        )
    return None


def exceeded_line(held_seconds: float, bound_seconds: float) -> str:
    """The one line a run stopped at its bound logs and writes to its termination message."""
    # Tenths of a second for a short hold, whole seconds past a minute ("5m3s", not "303.2s").
    held = round(held_seconds, 1) if held_seconds < 60 else float(round(held_seconds))
    return (
        f"{MAX_HOLD_EXCEEDED}: held {format_duration(held)}, bound {format_duration(bound_seconds)}"
    )
