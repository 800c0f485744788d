"""Prometheus metrics of the operator, prefix `cronlock_`, on their own registry."""

from __future__ import annotations

import collections
import contextlib
import logging
import platform
import re
import selectors
import socket
import threading
import time
import typing
import urllib.parse
from collections.abc import Iterable
from http import HTTPStatus
from importlib import metadata

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    make_wsgi_app,
)

from cronlock_operator.reconcile.keys import Key

logger = logging.getLogger(__name__)

# `*_created` series double the counters' series and no alert reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]
registry = CollectorRegistry(auto_describe=True)

guarded_cronjobs = Gauge(
    "cronlock_guarded_cronjobs",
    "CronJobs whose runs cronlock guards with a Lease",
    registry=registry,
)
runs = Counter(
    "cronlock_runs",
    "Runs seen by the operator, by result (acquired, skipped, lost, released)",
    ["result"],
    registry=registry,
)
consecutive_skips = Gauge(
    "cronlock_consecutive_skips",
    "Skipped runs in a row per CronJob (reset by a successful run)",
    ["namespace", "cronjob"],
    registry=registry,
)
lease_held = Gauge(
    "cronlock_lease_held",
    "1 while a lock's Lease has a holder",
    ["namespace", "lock"],
    registry=registry,
)
takeovers = Counter(
    "cronlock_takeovers",
    "Holders cleared by the operator, by reason",
    ["reason"],
    registry=registry,
)
overlaps = Counter(
    "cronlock_overlaps",
    "Runs under the observe policy that ran while another run held their lock",
    registry=registry,
)
replacements = Counter(
    "cronlock_replacements",
    "Runs stopped under the replace policy because a newer run took their lock over",
    registry=registry,
)
reconcile_errors = Counter(
    "cronlock_reconcile_errors",
    "Reconciles that failed and were retried, by kind",
    ["kind"],
    registry=registry,
)

reconcile_duration = Histogram(
    "cronlock_reconcile_duration_seconds",
    "How long one reconcile took, by kind (a retried one counts once per try)",
    ["kind"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=registry,
)
build_info = Gauge(
    "cronlock_build_info",
    "Always 1; the labels say which operator version runs, on which Python",
    ["version", "python"],
    registry=registry,
)


def _version() -> str:
    try:
        return metadata.version("cronlock")
    except metadata.PackageNotFoundError:
        return "unknown"


build_info.labels(_version(), platform.python_version()).set(1)


def forget_cronjob(namespace: str, name: str) -> None:
    """A deleted CronJob's series go with it (Prometheus would keep showing the last value)."""
    _remove(consecutive_skips, namespace, name)


def forget_lock(namespace: str, lock: str) -> None:
    """A deleted Lease's series go with it."""
    _remove(lease_held, namespace, lock)


def _remove(gauge: Gauge, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # never set
        gauge.remove(*labels)


# Every label value a counter can take exists from the start at 0, so that rate() and
# increase() see the first run, skip, takeover or error after a restart.
RUN_RESULTS = ("acquired", "skipped", "lost", "released")
TAKEOVER_REASONS = ("expired",)
RECONCILE_KINDS = tuple(key.kind for key in typing.get_args(Key))
for _result in RUN_RESULTS:
    runs.labels(_result)
for _reason in TAKEOVER_REASONS:
    takeovers.labels(_reason)
for _kind in RECONCILE_KINDS:
    reconcile_errors.labels(_kind)
    reconcile_duration.labels(_kind)


# Any pod in the cluster can reach /metrics, so what its clients can hold is bounded: each
# connection is a thread and a buffer, and the operator has 256 Mi.
CONNECTIONS = 32  # open at once, all clients together; more are closed as they come
CONNECTIONS_PER_CLIENT = 4  # per address, so one pod cannot take them all from Prometheus
TIMEOUT = 5.0  # seconds from accept to close, for the request and the answer together
REQUEST_LINE_BYTES = 1024
HEAD_BYTES = 8192  # the request line and headers (a bearer token is about 1 KiB)
LINGER_SECONDS = 1.0  # reading what a client still sends after the answer (see _close)
POLL_SECONDS = 0.25  # how soon `stop` is noticed
PATH = "/metrics"

_END_OF_HEAD = re.compile(rb"\r?\n\r?\n")
_TEXT = "text/plain; charset=utf-8"
# prometheus_client's own answer (the format the scraper asks for, gzip if it may), here
# behind a server that bounds its clients.
_exposition = make_wsgi_app(registry)


class _Refused(Exception):
    """A request answered with an error status instead of the metrics."""

    def __init__(
        self, status: HTTPStatus, headers: dict[str, str] | None = None, head_only: bool = False
    ) -> None:
        super().__init__(status.phrase)
        self.status = status
        self.headers = headers or {}
        self.head_only = head_only  # the answer to a HEAD has no body, whatever its status


class MetricsServer:
    """/metrics over HTTP/1.1: GET or HEAD, one request per connection, each connection
    closed within `timeout` seconds, at most `connections` open (`per_client` per address);
    a connection over either cap is closed as soon as it is accepted, without a thread."""

    def __init__(
        self,
        address: str,
        port: int,
        *,
        timeout: float = TIMEOUT,
        connections: int = CONNECTIONS,
        per_client: int = CONNECTIONS_PER_CLIENT,
    ) -> None:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._listener = socket.create_server((address, port), family=family)
        # Accepting never waits: select says when, and a client gone since finds none.
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self.timeout = timeout
        self.connections = connections
        self.per_client = per_client
        self._open: collections.Counter[str] = collections.Counter()
        self._open_in_all = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="cronlock-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Accept no more connections (those open end within `timeout`)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()
        self._listener.close()

    def _accept(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            while not self._stopping.is_set():
                if not selector.select(POLL_SECONDS):
                    continue
                try:
                    connection, peer = self._listener.accept()
                except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                    continue
                except OSError as error:
                    # Out of file descriptors, say: the listener stays readable, so wait
                    # rather than spin.
                    logger.warning("metrics: cannot accept a connection: %s", error)
                    self._stopping.wait(POLL_SECONDS)
                    continue
                self._admit(connection, str(peer[0]))

    def _admit(self, connection: socket.socket, client: str) -> None:
        with self._lock:
            admitted = self._open_in_all < self.connections and self._open[client] < self.per_client
            if admitted:
                self._open_in_all += 1
                self._open[client] += 1
        if not admitted:
            logger.debug("metrics: connection from %s refused: too many open", client)
            connection.close()
            return
        thread = threading.Thread(
            target=self._serve,
            args=(connection, client),
            name="cronlock-metrics-connection",
            daemon=True,
        )
        try:
            thread.start()
        except RuntimeError:  # no thread to be had: the connection goes, the server stays
            self._release(client)
            connection.close()

    def _release(self, client: str) -> None:
        with self._lock:
            self._open_in_all -= 1
            self._open[client] -= 1
            if not self._open[client]:
                del self._open[client]

    def _serve(self, connection: socket.socket, client: str) -> None:
        deadline = time.monotonic() + self.timeout
        try:
            with connection:
                try:
                    head_only, headers, body = _answer(_read_head(connection, deadline))
                    status = HTTPStatus.OK
                except _Refused as refusal:
                    head_only, body = refusal.head_only, f"{refusal.status.phrase}\n".encode()
                    status, headers = refusal.status, {"Content-Type": _TEXT, **refusal.headers}
                _send(connection, deadline, status, headers, body, head_only)
                _close(connection, deadline)
        except OSError as error:  # too slow (TimeoutError), reset or gone
            logger.debug("metrics: connection from %s dropped: %s", client, error)
        except Exception:
            logger.exception("metrics: answering %s failed", client)
        finally:
            self._release(client)


def _within(connection: socket.socket, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("connection open too long")
    connection.settimeout(left)


def _read_head(connection: socket.socket, deadline: float) -> bytes:
    """The request line and headers; _Refused when they are too long, TimeoutError when
    they are not all there by `deadline`."""
    head = b""
    while (end := _END_OF_HEAD.search(head)) is None:
        _check_lengths(head)
        _within(connection, deadline)
        chunk = connection.recv(4096)
        if not chunk:
            raise ConnectionAbortedError("closed before the end of its request")
        head += chunk
    head = head[: end.end()]
    _check_lengths(head)
    return head


def _check_lengths(head: bytes) -> None:
    line_end = head.find(b"\n")
    if (line_end if line_end >= 0 else len(head)) > REQUEST_LINE_BYTES:
        raise _Refused(HTTPStatus.REQUEST_URI_TOO_LONG)
    if len(head) > HEAD_BYTES:
        raise _Refused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)


def _answer(head: bytes) -> tuple[bool, dict[str, str], bytes]:
    """(whether only the headers go back, the headers, the exposition) for `head`."""
    request_line, *lines = (line.rstrip("\r") for line in head.decode("latin-1").split("\n"))
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _Refused(HTTPStatus.BAD_REQUEST)
    method, target, _ = parts
    fields: dict[str, str] = {}
    for line in filter(None, lines):
        name, colon, value = line.partition(":")
        if not colon:
            raise _Refused(HTTPStatus.BAD_REQUEST)
        fields[name.strip().lower()] = value.strip()
    url = urllib.parse.urlsplit(target)
    head_only = method == "HEAD"
    if url.path != PATH:
        raise _Refused(HTTPStatus.NOT_FOUND, head_only=head_only)
    if method not in ("GET", "HEAD"):
        raise _Refused(HTTPStatus.METHOD_NOT_ALLOWED, {"Allow": "GET, HEAD"})
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": url.path,
        "QUERY_STRING": url.query,
        "HTTP_ACCEPT": fields.get("accept", ""),
        "HTTP_ACCEPT_ENCODING": fields.get("accept-encoding", ""),
    }
    headers: dict[str, str] = {}

    def start_response(status: str, answered: Iterable[tuple[str, str]]) -> None:
        headers.update(answered)

    body = b"".join(typing.cast(Iterable[bytes], _exposition(environ, start_response)))
    return head_only, headers, body


def _send(
    connection: socket.socket,
    deadline: float,
    status: HTTPStatus,
    headers: dict[str, str],
    body: bytes,
    head_only: bool,
) -> None:
    lines = [
        f"HTTP/1.1 {status.value} {status.phrase}",
        *(f"{name}: {value}" for name, value in headers.items()),
        f"Content-Length: {len(body)}",
        "Connection: close",  # one request per connection: no thread waits for a next one
        "",
        "",
    ]
    _within(connection, deadline)  # sendall's timeout bounds the whole answer
    connection.sendall("\r\n".join(lines).encode("latin-1") + (b"" if head_only else body))


def _close(connection: socket.socket, deadline: float) -> None:
    """Close after the answer; unread bytes from the client (a next request, the rest of a
    refused one) are read first, or the close would reset the connection and the client
    could lose the answer."""
    connection.shutdown(socket.SHUT_WR)
    deadline = min(deadline, time.monotonic() + LINGER_SECONDS)
    with contextlib.suppress(TimeoutError):
        while True:
            _within(connection, deadline)
            if not connection.recv(4096):
                return


def serve(port: int, address: str = "0.0.0.0") -> MetricsServer:
    """Serve /metrics on `address` (all interfaces by default: a Service scrapes it)."""
    server = MetricsServer(address, port)
    server.start()
    return server
