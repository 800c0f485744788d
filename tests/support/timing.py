"""The timing bounds of tests on real processes, each derived from the timing model.

A test that times a real process (the sidecar, its watchdog, the work it guards) asserts a
window, never a moment. The window comes from what the product promises for the `Timing`
the test sets (lock/model.py): a holder gives up `renew_deadline` (2/3 of the ttl) after
the last renewal it sent, renewals go out every `renew`, the watchdog acts at the deadline
the last heartbeat gave it and SIGKILLs `kill grace` after SIGTERM, a dead parent is seen
at once. To the time the model gives, a bound adds `SLACK` and nothing else: what a busy
2-core machine may add before the test sees the act (a wake-up, a signal, a reap, the
test's own poll). Each bound names the path it proves (the watchdog at the deadline, not
the kill grace) and refuses a timing whose alternative path falls inside the slack, where
the bound could no longer tell the two apart: lengthen the test's timing instead.

The one bound that gets no slack is the safety relation: a run that lost its Lease is
stopped before the ttl has passed since the last renewal the API server stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from cronlock_sidecar.lock.model import Timing

# Seconds a real-process step may be seen late when the unit ring runs beside the e2e
# ring's node start-up and image imports, the longwatch ring's control plane and the
# tools' Go builds on 2 cores. A frozen-sidecar bound with 1.0 s of it failed once in a
# full run (review 2026-12-05-tests, 2.3); twice that, and a ttl of 3 x SLACK gives the
# safety relation room for it (ttl - renew deadline = ttl/3).
SLACK = 2.0


class Bound(NamedTuple):
    """`low <= seconds < high` after `since`: landing inside shows that `path` acted."""

    low: float
    high: float
    since: str
    path: str

    def check(self, seconds: float) -> float:
        """`seconds` if inside the window; else an AssertionError naming the path."""
        if not self.low <= seconds < self.high:
            raise AssertionError(
                f"{seconds:.2f}s after {self.since}, outside [{self.low:g}s, {self.high:g}s) "
                f"expected when {self.path}"
            )
        return seconds


def _separates(expected: float, alternative: float, what: str) -> None:
    if expected + SLACK > alternative:
        raise ValueError(
            f"{what}: the path is expected within {expected:g}s, and with the {SLACK:g}s "
            f"slack that reaches the alternative at {alternative:g}s; lengthen the timing"
        )


def at_once(since: str, path: str, *, instead_of: float, alternative: str) -> Bound:
    """Nothing to wait for but the machine: within SLACK, before `alternative` could act."""
    _separates(0.0, instead_of, path)
    return Bound(0.0, SLACK, since, f"{path}, not {alternative} ({instead_of:g}s)")


def at_deadline(deadline: float, since: str, path: str) -> Bound:
    """An act due `deadline` seconds after `since`, on the same monotonic clock: never
    before it (the product checks the clock before it acts), at most SLACK after."""
    return Bound(deadline, deadline + SLACK, since, path)


def earliest_renew_deadline(timing: Timing) -> float:
    """The soonest the renew deadline can come after any moment while renewals go on: the
    last renewal was sent at most one renew period before it."""
    return timing.renew_deadline - timing.renew


def at_next_renewal(timing: Timing, since: str, path: str) -> Bound:
    """Seen by the next renewal (one renew period after `since`), not at the renew deadline."""
    _separates(timing.renew, earliest_renew_deadline(timing), path)
    return Bound(
        0.0,
        earliest_renew_deadline(timing),
        since,
        f"{path} at the next renewal (every {timing.renew:g}s), not at the renew deadline",
    )


SINCE_LAST_RENEWAL = "the last renewal the API server stored"


def at_renew_deadline(timing: Timing, path: str, *, since: str = SINCE_LAST_RENEWAL) -> Bound:
    """A holder whose renewals stopped reaching the store, measured from the last one the
    API server stored (or the holder saw succeed): stopped at the renew deadline, and
    before the Lease could expire.

    Low: that last renewal may be one whose answer the holder never read (frozen while it
    was on the wire, or answered after the store broke); its deadline is then the one of the
    renewal before, sent one renew period (and that renewal's own delay) earlier. Two renew
    periods under the deadline is still later than the first failed or unsent renewal (one
    renew period), which is what an early stop would follow. High: the safety relation,
    with no slack; the timing must leave the slack between the deadline and the ttl.
    """
    low = timing.renew_deadline - 2 * timing.renew
    if low <= timing.renew:
        raise ValueError(
            f"{path}: a renew of {timing.renew:g}s leaves the renew deadline "
            f"({timing.renew_deadline:g}s) too close to the next renewal to tell them apart"
        )
    _separates(timing.renew_deadline, timing.ttl, path)
    return Bound(
        low,
        timing.ttl,
        since,
        f"{path} at the renew deadline ({timing.renew_deadline:g}s), before the Lease "
        f"could expire (ttl {timing.ttl:g}s)",
    )


def renewals_within(timing: Timing, count: int) -> float:
    """Seconds in which `count` more renewals reach the API server: one every renew period."""
    return count * timing.renew + SLACK


def liveness_verdict(probe: Mapping[str, Any]) -> float:
    """Seconds after a moment when the container's livenessProbe (as the pod spec has it)
    went unanswered by which the kubelet has acted on it: up to one period until the next
    probe, then `failureThreshold` probes in a row, each failing within its timeout (or the
    period, if longer), as the operator's `ProbeTolerance.detection_ms` counts; then SLACK.
    A run still working that long after a flood ended was never killed by its probe."""
    period = float(probe.get("periodSeconds", 10))
    each = max(float(probe.get("timeoutSeconds", 1)), period)
    return period + int(probe.get("failureThreshold", 3)) * each + SLACK
