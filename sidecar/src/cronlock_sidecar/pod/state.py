"""What the sidecar's endpoints report: written by the holder, read by the HTTP threads."""

from __future__ import annotations

import threading
import time
from collections import Counter

METRIC_PREFIX = "cronlock_sidecar_"


class SidecarState:
    """What /held, /healthz and /metrics answer (pod/endpoints.py serves them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.held = False
        # Observe policy: /held answers 200 whatever happens, so the run is never stopped.
        self.never_stop = False
        # The run was stopped at its max-hold: /held answers 503 while the Lease is still
        # held (renewed until the pod ends).
        self.stopping = False
        self.decision = ""
        self.fencing_token = -1
        self.renewals: Counter[str] = Counter()
        self.lost_total = 0
        self.releases: Counter[str] = Counter()
        self.last_renew_monotonic: float | None = None
        self.started = time.monotonic()

    def update(
        self,
        *,
        held: bool | None = None,
        decision: str | None = None,
        fencing_token: int | None = None,
        never_stop: bool | None = None,
        stopping: bool | None = None,
    ) -> None:
        with self._lock:
            if stopping is not None:
                self.stopping = stopping
            if never_stop is not None:
                self.never_stop = never_stop
            if held is not None:
                self.held = held
            if decision is not None:
                self.decision = decision
            if fencing_token is not None:
                self.fencing_token = fencing_token

    def count_renewal(self, result: str, at: float | None = None) -> None:
        with self._lock:
            self.renewals[result] += 1
        if result == "renewed" and at is not None:
            self.mark_renewed(at)

    def mark_renewed(self, at: float) -> None:
        """The monotonic send time of the last successful write (acquire or renew)."""
        with self._lock:
            self.last_renew_monotonic = at

    def count_lost(self) -> None:
        with self._lock:
            self.lost_total += 1
            self.held = False

    def count_release(self, result: str) -> None:
        with self._lock:
            self.releases[result] += 1

    def is_held(self) -> bool:
        """What /held answers: held, or (observe policy) never to be stopped."""
        with self._lock:
            return (self.held and not self.stopping) or self.never_stop

    def metrics(self) -> str:
        """Prometheus text exposition format 0.0.4."""
        with self._lock:
            lines: list[str] = []

            def family(name: str, kind: str, text: str) -> None:
                lines.append(f"# HELP {METRIC_PREFIX}{name} {text}")
                lines.append(f"# TYPE {METRIC_PREFIX}{name} {kind}")

            family("held", "gauge", "1 while this pod holds the Lease.")
            lines.append(f"{METRIC_PREFIX}held {int(self.held)}")
            family("decision", "gauge", "The decision of this run (1 for the current one).")
            for decision in ("run", "skip", "unavailable", "overlap", "already-ran"):
                value = int(self.decision == decision)
                lines.append(f'{METRIC_PREFIX}decision{{decision="{decision}"}} {value}')
            family("fencing_token", "gauge", "leaseTransitions after this run acquired.")
            lines.append(f"{METRIC_PREFIX}fencing_token {self.fencing_token}")
            family("renewals_total", "counter", "Renew attempts by result.")
            for result in ("renewed", "failed", "lost"):
                lines.append(
                    f'{METRIC_PREFIX}renewals_total{{result="{result}"}} {self.renewals[result]}'
                )
            family("lost_total", "counter", "Times the Lease was lost during the run.")
            lines.append(f"{METRIC_PREFIX}lost_total {self.lost_total}")
            family("releases_total", "counter", "Release attempts by result.")
            for result in ("released", "failed"):
                lines.append(
                    f'{METRIC_PREFIX}releases_total{{result="{result}"}} {self.releases[result]}'
                )
            family(
                "seconds_since_renew", "gauge", "Seconds since the last successful renew, or -1."
            )
            since = (
                time.monotonic() - self.last_renew_monotonic
                if self.last_renew_monotonic is not None
                else -1.0
            )
            lines.append(f"{METRIC_PREFIX}seconds_since_renew {since:.3f}")
            return "\n".join(lines) + "\n"
