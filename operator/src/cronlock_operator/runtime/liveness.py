"""The operator's liveness probe (/healthz), on the bounded server for the whole life of the
process: alive while a replica waits to lead, and once it leads, while the event loop
runs the operator's due checks.

kopf's own endpoint (aiohttp, no connection cap, an hour's keep-alive, 128 headers of
8 KiB held per connection) let any pod in the cluster grow the operator past its memory
limit (security review M3). What it reported is kept: cronlock registers no kopf probe
handlers, so kopf answered 200 as soon as the start-up handlers had finished and for as
long as its event loop could answer, and nothing before. Here the loop's due-check task,
started by the start-up handler, beats once a round (runtime.handlers): no beat yet is
"starting", a beat older than BEAT_LIMIT_SECONDS (the loop blocked, or the task that
clears expired holds dead) is "stalled"; both answer 503, and the kubelet restarts the
operator after its failureThreshold.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Callable, Mapping
from http import HTTPStatus

from cronlock_operator.runtime.httpserver import Answer, BoundedServer

# The kubelet's probe is one short request every 20 s from the node's address; a few
# slots, two per address and two seconds each are plenty for it, and all a flood can hold.
CONNECTIONS = 8
CONNECTIONS_PER_CLIENT = 2
TIMEOUT = 2.0
# The due checks run every second: ten missed rounds is a stuck loop, not a busy one
# (kopf's probe failed once the loop was blocked for the chart's timeoutSeconds, 5 s).
BEAT_LIMIT_SECONDS = 10.0

_JSON = {"Content-Type": "application/json"}


class Liveness:
    """What /healthz says: waiting to lead, starting, running or stalled."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._waiting = False
        self._beat: float | None = None

    def waiting(self, waiting: bool) -> None:
        """While a replica waits to lead it has no loop to judge: it is alive."""
        self._waiting = waiting

    def beat(self) -> None:
        """The event loop completed a round of the due checks."""
        self._beat = self._clock()

    def answer(self, query: str, fields: Mapping[str, str]) -> Answer:
        if self._waiting:
            return HTTPStatus.OK, _JSON, _body(state="waiting", detail="waiting to lead")
        if self._beat is None:
            return (
                HTTPStatus.SERVICE_UNAVAILABLE,
                _JSON,
                _body(state="starting", detail="the start-up handler has not finished"),
            )
        age = self._clock() - self._beat
        if age > BEAT_LIMIT_SECONDS:
            return (
                HTTPStatus.SERVICE_UNAVAILABLE,
                _JSON,
                _body(
                    state="stalled",
                    detail=f"no round of the due checks for {age:.1f}s "
                    f"(limit {BEAT_LIMIT_SECONDS:.0f}s): the event loop is blocked or the "
                    "due-check task ended",
                ),
            )
        return HTTPStatus.OK, _JSON, _body(state="running", detail=f"last round {age:.1f}s ago")


def _body(**fields: str) -> bytes:
    return json.dumps(fields).encode()


# The process's one state: the CLI serves it, the kopf handlers' loop beats it.
state = Liveness()


def endpoint(url: str) -> tuple[str, int, str]:
    """(address, port, path) of a --liveness URL; ValueError saying what is wrong."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise ValueError(
            f"--liveness: {url!r} is not http://ADDRESS:PORT/PATH "
            "(for example http://0.0.0.0:8081/healthz; '' turns the endpoint off)"
        )
    return parts.hostname, port, parts.path or "/"


def serve(url: str, liveness: Liveness = state) -> BoundedServer:
    """Serve `liveness` at `url` (see `endpoint`); OSError when the port cannot be bound."""
    address, port, path = endpoint(url)
    server = BoundedServer(
        address,
        port,
        {path: liveness.answer},
        timeout=TIMEOUT,
        connections=CONNECTIONS,
        per_client=CONNECTIONS_PER_CLIENT,
        name="cronlock-liveness",
    )
    server.start()
    return server
