"""The run policies: what a run does when it finds the lock held (skip at once, or wait)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from cronlock_sidecar.lease import Acquired, Busy, LeaseKeeper

log = logging.getLogger("cronlock_sidecar.lease")


def acquire(
    keeper: LeaseKeeper,
    *,
    wait: bool,
    wait_timeout: float,
    pause: Callable[[float], bool],
) -> Acquired | Busy:
    """Decide under a policy: skip at once, or retry until `wait_timeout` has passed.

    A hold that expired but only the operator may clear (the holders' admission policy) is
    waited for under either policy, at most one renew interval plus the skew: that is how
    late the operator clears it after this pod judged it expired, clocks allowing.
    `pause(seconds)` sleeps and returns True when the caller was asked to stop.
    """
    started = keeper.clock.monotonic()
    retry_every = min(keeper.timing.renew, 1.0)
    clearing_timeout = keeper.timing.renew + keeper.timing.skew
    announced = False
    while True:
        result = keeper.try_acquire()
        if isinstance(result, Acquired):
            return result
        if not wait and not result.clearing:
            return result
        timeout = wait_timeout if wait else 0.0
        if result.clearing:
            timeout = max(timeout, clearing_timeout)
        left = started + timeout - keeper.clock.monotonic()
        if left <= 0:
            return result
        if not announced:
            why = "expired; waiting for the operator to clear it" if result.clearing else ""
            log.info(
                "lease %s held by %s%s; waiting up to %.0fs",
                keeper.lease,
                result.holder,
                f" ({why})" if why else "",
                left,
            )
            announced = True
        if pause(min(retry_every, left)):
            return result
