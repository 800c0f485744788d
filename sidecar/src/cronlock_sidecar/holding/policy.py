"""The run policies: what a run does when it finds the lock held.

- skip: give up at once;
- wait: retry until the wait timeout;
- replace: ask the holder to yield (a note on the Lease it reads at its next renewal),
  then take the Lease once the holder released it or it expired, within the wait
  timeout; the newest replace run wins;
- observe: like skip, but the caller runs anyway and records the overlap (`note`);
- queue: as wait. Its Job waited suspended, without a pod, until the operator let it go
  at a release; a run of another policy that took the lock in between costs a wait.

On a lock of N > 1 permits (lock/permits.py) a run takes a free permit under every policy;
when all N are held, skip skips, wait waits for any permit, observe runs anyway, and
replace skips: which of N holders a replace run should stop is not settled (the oldest?
one of its own CronJob?), so it asks none to yield (not supported yet).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from cronlock_sidecar.contract import ANNOTATION_OVERLAP, ANNOTATION_YIELD_TO, WAITING_POLICIES
from cronlock_sidecar.holding.lease import MAX_CONFLICTS, Acquired, Busy, LeaseKeeper
from cronlock_sidecar.lock.model import noted, read_lease
from cronlock_sidecar.transport.seam import ApiError, Conflict, Lease, NotFound, Unavailable

log = logging.getLogger("cronlock_sidecar.lease")


def acquire(
    keeper: LeaseKeeper,
    *,
    policy: str,
    wait_timeout: float,
    pause: Callable[[float], bool],
) -> Acquired | Busy:
    """Decide under `policy`; a Busy answer means the run does not hold the Lease.

    A hold that expired but only the operator may clear (the holders' admission policy) is
    waited for under every policy, up to one renew interval plus the skew after it was
    first seen: that is how late the operator clears it after this pod judged it expired,
    clocks allowing. `pause(seconds)` sleeps and returns True when asked to stop.
    """
    clock = keeper.clock
    started = clock.monotonic()
    started_at = clock.now()
    retry_every = min(keeper.timing.renew, 1.0)
    waits = policy in WAITING_POLICIES
    deadline = started + (wait_timeout if waits else 0.0)
    clearing_since: float | None = None
    asked = False
    announced = False
    while True:
        result = keeper.try_acquire()
        if isinstance(result, Acquired) or result.why:
            return result
        if policy == "replace" and result.permits and not result.clearing:
            return result._replace(why="replace with permits")
        if policy == "replace" and not result.clearing:
            newer = _newer_run(result, asked, started_at, keeper)
            if newer:
                return result._replace(why="superseded", other=newer)
            if result.yield_to != keeper.identity:
                asked = _ask_to_yield(keeper, result) or asked
        if result.clearing:
            if clearing_since is None:
                clearing_since = clock.monotonic()
            deadline = max(deadline, clearing_since + keeper.timing.renew + keeper.timing.skew)
        left = deadline - clock.monotonic()
        if left <= 0:
            if policy == "replace" and not result.clearing:
                return result._replace(why="not yielded")
            return result
        if not announced:
            log.info("%s; waiting up to %.0fs", _waiting_for(result, policy), left)
            announced = True
        if pause(min(retry_every, left)):
            return result


def _newer_run(result: Busy, asked: bool, started_at: datetime, keeper: LeaseKeeper) -> str:
    """The run that replaces the holder instead of us, if a newer one came ("" if none).

    Newer: it asked the holder to yield after we did (the order of writes to the Lease),
    or it is the holder and took the Lease more than the skew after we started (by the
    wall clocks, which may differ by that much: a holder within it counts as older, is
    replaced, and its run ends, so nothing goes back and forth).
    """
    if asked and result.yield_to and result.yield_to != keeper.identity:
        return result.yield_to
    if result.acquired_at is not None and result.acquired_at > started_at + timedelta(
        seconds=keeper.timing.skew
    ):
        return result.holder
    return ""


def _ask_to_yield(keeper: LeaseKeeper, result: Busy) -> bool:
    try:
        written = note(keeper, ANNOTATION_YIELD_TO)
    except ApiError as error:
        log.warning(
            "lease %s: cannot ask %s to yield (%s); waiting for it to end or expire",
            keeper.lease,
            result.holder,
            error,
        )
        return False
    if written is not None:
        log.info(
            "lease %s held by %s: asked it to yield to %s (replace policy)",
            keeper.lease,
            result.holder,
            keeper.identity,
        )
    return written is not None


def _waiting_for(result: Busy, policy: str) -> str:
    if result.clearing:
        return (
            f"lease {result.lease} held by {result.holder} (expired; waiting for the "
            "operator to clear it)"
        )
    if result.permits:
        return f"all {len(result.permits)} permits of lock {result.lease} are held"
    if policy == "replace":
        return f"lease {result.lease} held by {result.holder}; waiting for it to yield"
    return f"lease {result.lease} held by {result.holder}"


def record_overlap(keeper: LeaseKeeper, holder: str) -> None:
    """Observe policy, the Lease held by another run: one line, and the overlap noted on
    the Lease for the operator (best effort: the run goes ahead either way)."""
    log.warning(
        "overlap: lease %s held by %s (observe policy: running anyway)", keeper.lease, holder
    )
    try:
        note(keeper, ANNOTATION_OVERLAP)
    except ApiError as error:
        log.warning("cannot record the overlap on lease %s: %s", keeper.lease, error)


def note(keeper: LeaseKeeper, annotation: str) -> Lease | None:
    """As a contender, set `annotation` (yield-to or overlap) to our identity on the Lease.

    The only write a pod that does not hold the Lease may make to it (the holders'
    admission policy). Returns the Lease as written, or None when it is free or ours by
    now (nothing to note). Raises Forbidden or Unavailable like an acquire.
    """
    for _ in range(MAX_CONFLICTS):
        try:
            current = keeper.transport.get(keeper.lease)
        except NotFound:
            return None
        record = read_lease(current)
        if not record.holder or record.holder == keeper.identity:
            return None
        annotations = (current.get("metadata") or {}).get("annotations") or {}
        if annotations.get(annotation) == keeper.identity:
            return current
        try:
            return keeper.transport.replace(
                keeper.lease, noted(current, annotation, keeper.identity)
            )
        except Conflict:
            continue
    raise Unavailable("update", keeper.lease, f"{MAX_CONFLICTS} write conflicts in a row")
