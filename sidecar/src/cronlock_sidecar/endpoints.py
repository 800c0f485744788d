"""/held for the liveness probe, /healthz and hand-written /metrics, on a small threaded server."""

from __future__ import annotations

import http.server
import logging
import threading
import time
from collections import Counter

from cronlock_sidecar.contract import HELD_PATH

log = logging.getLogger("cronlock_sidecar.endpoints")

METRIC_PREFIX = "cronlock_sidecar_"


class SidecarState:
    """What the probes and metrics report; written by the holder, read by the HTTP threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.held = False
        # Observe policy: /held answers 200 whatever happens, so the run is never stopped.
        self.never_stop = False
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
    ) -> None:
        with self._lock:
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
            return self.held or self.never_stop

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
            for decision in ("run", "skip", "unavailable", "overlap"):
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


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        state = self.server.state
        path = self.path.split("?", 1)[0]
        if path == HELD_PATH:
            held = state.is_held()
            self._answer(200 if held else 503, "held\n" if held else "not held\n")
        elif path == "/healthz":
            self._answer(200, "ok\n")
        elif path == "/metrics":
            self._answer(200, state.metrics(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._answer(404, "not found\n")

    def _answer(self, status: int, body: str, content_type: str = "text/plain") -> None:
        payload = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("http: " + format, *args)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], state: SidecarState) -> None:
        self.state = state
        super().__init__(address, _Handler)


class Endpoints:
    """The sidecar's HTTP server, running on a daemon thread."""

    def __init__(self, state: SidecarState, port: int, host: str = "0.0.0.0") -> None:
        self._server = _Server((host, port), state)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="cronlock-http",
            daemon=True,
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
