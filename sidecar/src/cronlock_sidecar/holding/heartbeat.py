"""The renew loop on its own thread, so a slow API call never delays the holder's checks."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from cronlock_sidecar.holding.lease import LeaseKeeper, RenewOutcome, RenewResult

log = logging.getLogger("cronlock_sidecar.heartbeat")


class Heartbeat:
    """Renews every `renew` seconds, retries failures sooner, and reports every outcome."""

    def __init__(
        self,
        keeper: LeaseKeeper,
        on_result: Callable[[RenewResult], None] = lambda _result: None,
    ) -> None:
        self.keeper = keeper
        self.on_result = on_result
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cronlock-renew", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, join_timeout: float = 0.5) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(join_timeout)

    def _loop(self) -> None:
        timing = self.keeper.timing
        retry_every = min(timing.renew, 1.0)
        delay = timing.renew
        while not self._stop.wait(delay):
            if self.keeper.check_deadline():
                self.on_result(RenewResult(RenewOutcome.LOST, "renew deadline passed"))
                return
            result = self.keeper.renew()
            self.on_result(result)
            if result.outcome is RenewOutcome.LOST:
                return
            if result.outcome is RenewOutcome.RENEWED:
                next_due = self.keeper.last_renew_sent() + timing.renew
                delay = max(0.0, next_due - self.keeper.clock.monotonic())
            else:
                delay = retry_every
