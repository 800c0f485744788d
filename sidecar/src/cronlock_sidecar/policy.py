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

    `pause(seconds)` sleeps and returns True when the caller was asked to stop.
    """
    started = keeper.clock.monotonic()
    retry_every = min(keeper.timing.renew, 1.0)
    announced = False
    while True:
        result = keeper.try_acquire()
        if isinstance(result, Acquired) or not wait:
            return result
        left = started + wait_timeout - keeper.clock.monotonic()
        if left <= 0:
            return result
        if not announced:
            log.info("lease %s held by %s; waiting up to %.0fs", keeper.lease, result.holder, left)
            announced = True
        if pause(min(retry_every, left)):
            return result
