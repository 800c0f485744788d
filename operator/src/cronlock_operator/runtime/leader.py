"""Leader election, so that `replicas: 2` is safe: one operator writes, the others wait.

The lock the operator gives CronJobs, for itself, on the same lock model
(`cronlock_sidecar.lock.model`): a Lease in its own namespace, held by `<hostname>_<pid>`,
written by `claimed`/`renewed`/`released`, renewed every `timing.renew`. A waiting
replica takes it when it is free, or when its holder has not renewed it for its duration
plus the skew, timed on the waiting replica's own monotonic clock since it last saw the
Lease change (`expiry.Observation`, the rule the operator clears guarded runs' holds by;
never by comparing wall clocks, as client-go's leader election does too). A leader that
has not renewed within `timing.renew_deadline` (two thirds of the duration, so shorter
than it by more than the skew) exits at once: by the time another replica may take the
Lease, it can write nothing more. The timing is checked as client-go's
`NewLeaderElector` checks its own, before anything is written. The Lease is read and
written through kube/leaderlease.py, the Kubernetes edge.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Final

from cronlock_operator.kube.errors import APIError
from cronlock_operator.kube.leaderlease import LeaderLeaseCalls
from cronlock_operator.reconcile.expiry import Observation
from cronlock_sidecar import contract
from cronlock_sidecar.lock.model import Timing, claimed, read_lease, released, renewed

logger = logging.getLogger(__name__)

# Duration 15 s, renew every 2 s, give up after 10 s without a renewal, 2 s of skew.
TIMING: Final = Timing.of(15, 2, 2)

WallClock = Callable[[], datetime.datetime]


def identity() -> str:
    return f"{socket.gethostname()}_{os.getpid()}"


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class Elector:
    """One replica's side of the election, over the Lease `namespace/name`."""

    def __init__(
        self,
        leases: LeaderLeaseCalls,
        namespace: str,
        name: str,
        me: str,
        clock: Callable[[], float] = time.monotonic,
        *,
        timing: Timing = TIMING,
        wall: WallClock = _utc_now,
    ) -> None:
        timing.check()  # TimingError before anything is written, as client-go refuses
        if not me:
            raise ValueError("leader election needs an identity")
        self.leases = leases
        self.namespace, self.name, self.me = namespace, name, me
        self.clock, self.wall, self.timing = clock, wall, timing
        self._seen: Observation | None = None
        self._renewed_at = -float("inf")
        self._stop = threading.Event()

    # --- taking the lead -------------------------------------------------------------
    def acquire(self, stop: threading.Event | None = None) -> bool:
        """Block until this replica leads (True), or `stop` is set (False)."""
        waiting_logged = False
        while stop is None or not stop.is_set():
            try:
                holder = self.try_acquire()
            except APIError as error:
                logger.warning("leader election: %s; trying again", error)
                holder = None
            if holder == self.me:
                logger.info("leading: lease %s/%s held by %s", self.namespace, self.name, self.me)
                return True
            if not waiting_logged and holder:
                logger.info(
                    "waiting to lead: lease %s/%s held by %s", self.namespace, self.name, holder
                )
                waiting_logged = True
            if stop is not None:
                stop.wait(self.timing.renew)
            else:
                time.sleep(self.timing.renew)
        return False

    def try_acquire(self) -> str:
        """One look: take the Lease if it is free, ours, or unrenewed; return its holder
        ("" when another replica wrote first)."""
        lease = self.leases.read(self.namespace, self.name)
        if lease is None:
            return self._create()
        record = read_lease(lease)
        now = self.clock()
        seen = self._seen
        if seen is None or (seen.holder, seen.renew_time) != (
            record.holder,
            record.renew_time_text,
        ):
            duration = record.duration_seconds or self.timing.lease_duration_seconds
            seen = Observation(
                record.holder, record.renew_time_text, duration, record.transitions, now
            )
            self._seen = seen
        if record.holder and record.holder != self.me and not seen.overdue(now, self.timing.skew):
            return record.holder
        if record.holder == self.me:
            body = renewed(lease, self.timing, self.wall())
        else:
            body = claimed(lease, self.me, self.timing, self.wall(), job_name="")
        return self._send(lambda: self.leases.replace(self.namespace, self.name, body))

    def _create(self) -> str:
        fresh = {
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": {contract.LABEL_MANAGED_BY: contract.MANAGED_BY},
            },
            "spec": {},
        }
        body = claimed(fresh, self.me, self.timing, self.wall(), job_name="")
        return self._send(lambda: self.leases.create(self.namespace, body))

    def _send(self, write: Callable[[], bool]) -> str:
        """One write of our hold; "" when another replica wrote first (409: look again)."""
        sent = self.clock()
        if not write():
            return ""
        self._renewed_at = sent
        return self.me

    # --- keeping it ------------------------------------------------------------------
    def renew_once(self) -> bool:
        """One renewal; False once the lead is lost (another holder, or the renew deadline
        passed without a successful renewal)."""
        try:
            if self.try_acquire() != self.me:
                logger.error("leadership lost: the lease names another replica")
                return False
        except APIError as error:
            logger.warning("leader lease not renewed: %s", error)
        if self.clock() - self._renewed_at > self.timing.renew_deadline:
            logger.error(
                "leadership lost: no renewal for %.0fs (deadline %.0fs)",
                self.clock() - self._renewed_at,
                self.timing.renew_deadline,
            )
            return False
        return True

    def keep(self, lost: Callable[[], None]) -> threading.Thread:
        """Renew in the background; call `lost` once the lead is lost."""

        def renew() -> None:
            while not self._stop.wait(self.timing.renew):
                if not self.renew_once():
                    lost()
                    return

        thread = threading.Thread(target=renew, name="cronlock-leader", daemon=True)
        thread.start()
        return thread

    def release(self) -> None:
        """On a clean stop: hand the lead over at once instead of after the duration."""
        self._stop.set()
        try:
            lease = self.leases.read(self.namespace, self.name)
            if lease is None or read_lease(lease).holder != self.me:
                return
            body = released(lease, self.me, self.wall())
            if self.leases.replace(self.namespace, self.name, body):
                logger.info("leader lease %s/%s released", self.namespace, self.name)
            else:
                logger.warning("leader lease not released: it changed since it was read")
        except APIError as error:
            logger.warning("leader lease not released: %s", error)
