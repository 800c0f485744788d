"""A small HTTP/1.1 server for the operator's open ports (/metrics, the liveness probe
while a replica waits to lead): any pod in the cluster can reach them, so what a client
can hold is bounded (connections in all and per address, one request each, a deadline
from accept to close) and a flood never starves the scraper or the kubelet's probe.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import re
import selectors
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from http import HTTPStatus

logger = logging.getLogger(__name__)

REQUEST_LINE_BYTES = 1024
HEAD_BYTES = 8192  # the request line and headers (a bearer token is about 1 KiB)
LINGER_SECONDS = 1.0  # reading what a client still sends after the answer (see _close)
POLL_SECONDS = 0.25  # how soon `stop` is noticed

_END_OF_HEAD = re.compile(rb"\r?\n\r?\n")
_TEXT = "text/plain; charset=utf-8"

# What a path answers: from the query string and the request's header fields (names in
# lower case), the answer's headers and body.
Route = Callable[[str, Mapping[str, str]], tuple[dict[str, str], bytes]]


class _Refused(Exception):
    """A request answered with an error status instead of the metrics."""

    def __init__(
        self, status: HTTPStatus, headers: dict[str, str] | None = None, head_only: bool = False
    ) -> None:
        super().__init__(status.phrase)
        self.status = status
        self.headers = headers or {}
        self.head_only = head_only  # the answer to a HEAD has no body, whatever its status


class BoundedServer:
    """A few paths over HTTP/1.1: GET or HEAD, one request per connection, each connection
    closed within `timeout` seconds, at most `connections` open (`per_client` per address);
    a connection over either cap is closed as soon as it is accepted, without a thread."""

    def __init__(
        self,
        address: str,
        port: int,
        routes: Mapping[str, Route],
        *,
        timeout: float,
        connections: int,
        per_client: int,
        name: str,
    ) -> None:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._listener = socket.create_server((address, port), family=family)
        # Accepting never waits: select says when, and a client gone since finds none.
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self.timeout = timeout
        self.connections = connections
        self.per_client = per_client
        self.routes = dict(routes)
        self.name = name
        self._open: collections.Counter[str] = collections.Counter()
        self._open_in_all = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept, name=name, daemon=True)

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
                    logger.warning("%s: cannot accept a connection: %s", self.name, error)
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
            logger.debug("%s: connection from %s refused: too many open", self.name, client)
            connection.close()
            return
        thread = threading.Thread(
            target=self._serve,
            args=(connection, client),
            name=f"{self.name}-connection",
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
                    head = _read_head(connection, deadline)
                    head_only, headers, body = _answer(head, self.routes)
                    status = HTTPStatus.OK
                except _Refused as refusal:
                    head_only, body = refusal.head_only, f"{refusal.status.phrase}\n".encode()
                    status, headers = refusal.status, {"Content-Type": _TEXT, **refusal.headers}
                _send(connection, deadline, status, headers, body, head_only)
                _close(connection, deadline)
        except OSError as error:  # too slow (TimeoutError), reset or gone
            logger.debug("%s: connection from %s dropped: %s", self.name, client, error)
        except Exception:
            logger.exception("%s: answering %s failed", self.name, client)
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


def _answer(head: bytes, routes: Mapping[str, Route]) -> tuple[bool, dict[str, str], bytes]:
    """(whether only the headers go back, the headers, the body) for `head`."""
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
    route = routes.get(url.path)
    if route is None:
        raise _Refused(HTTPStatus.NOT_FOUND, head_only=head_only)
    if method not in ("GET", "HEAD"):
        raise _Refused(HTTPStatus.METHOD_NOT_ALLOWED, {"Allow": "GET, HEAD"})
    headers, body = route(url.query, fields)
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
