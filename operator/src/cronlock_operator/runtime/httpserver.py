"""A small HTTP/1.1 server for the operator's open ports (/metrics, the liveness probe):
any pod in the cluster can reach them, so what a client can hold is bounded (connections
in all and per address, one request each, a head of 8 KiB, a deadline from accept to
close) and a flood never starves the scraper or the kubelet's probe: when every slot is
taken, a peer holding fewer than the busiest takes the busiest peer's oldest slot (one
already answered first), and while too many evicted connections are still on their way
out, newcomers wait in a short line (cronlock_sidecar.waitline, the sidecar's too), the
least busy peer's first, instead of being reset.
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

from cronlock_sidecar.waitline import WaitLine, slot_to_take

logger = logging.getLogger(__name__)

REQUEST_LINE_BYTES = 1024
HEAD_BYTES = 8192  # the request line and headers (a bearer token is about 1 KiB)
LINGER_SECONDS = 1.0  # reading what a client still sends after the answer (see _close)
POLL_SECONDS = 0.25  # how soon `stop` is noticed
FLOOD_LOG_SECONDS = 60.0  # at most one warning a minute about a full server

_END_OF_HEAD = re.compile(rb"\r?\n\r?\n")
_TEXT = "text/plain; charset=utf-8"

# What a path answers: from the query string and the request's header fields (names in
# lower case), the answer's status, headers and body.
Answer = tuple[HTTPStatus, dict[str, str], bytes]
Route = Callable[[str, Mapping[str, str]], Answer]


class _Refused(Exception):
    """A request answered with an error status instead of the metrics."""

    def __init__(
        self, status: HTTPStatus, headers: dict[str, str] | None = None, head_only: bool = False
    ) -> None:
        super().__init__(status.phrase)
        self.status = status
        self.headers = headers or {}
        self.head_only = head_only  # the answer to a HEAD has no body, whatever its status


class _Connection:
    __slots__ = ("answered", "ended", "opened", "peer", "sock")

    def __init__(self, sock: socket.socket, peer: str, opened: float) -> None:
        self.sock = sock
        self.peer = peer
        self.opened = opened
        self.ended = False  # evicted: its thread is on its way out
        self.answered = False  # its answer is sent: only its close is left


class BoundedServer:
    """A few paths over HTTP/1.1: GET or HEAD, one request per connection, each connection
    closed within `timeout` seconds, at most `connections` served at once (`per_client`
    per address). When all are taken, a newcomer from an address holding fewer than the
    busiest address takes that address's oldest connection (waitline.slot_to_take, the
    sidecar's rule too): a few pods reconnecting in a loop cannot keep the
    scraper or the kubelet out; of that address's connections, one already answered goes
    first, so a client still waiting for its answer is the last to lose it. A connection
    refused is closed as soon as it is accepted, without a thread; an evicted one's thread
    lets go of it at once. While `slack` of those are on their way out, a newcomer waits
    without a thread in a line of at most `connections` (when it is full, the busiest
    peer's newest goes), and a slot that frees goes to the least busy peer's oldest in line
    (cronlock_sidecar.waitline says how busy): a probe is let in at the next free slot, not
    reset because evicted threads were slow to leave on a loaded machine."""

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
        slack: int = 8,
    ) -> None:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._listener = socket.create_server((address, port), family=family)
        # Accepting never waits: select says when, and a client gone since finds none.
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self.timeout = timeout
        self.connections = connections
        self.per_client = per_client
        self.slack = slack
        self.routes = dict(routes)
        self.name = name
        self.evicted = 0  # connections ended early for a newcomer, since the start
        self._open: dict[socket.socket, _Connection] = {}
        self._lock = threading.Lock()
        # Accepted while the slack was full, no thread yet (cronlock_sidecar.waitline).
        self._line: WaitLine[socket.socket] = WaitLine(connections, timeout)
        # A byte on `_wake` wakes the accept thread when a connection leaves `_open`.
        self._wake, self._woken = socket.socketpair()
        self._wake.setblocking(False)
        self._woken.setblocking(False)
        self._flood_logged = -FLOOD_LOG_SECONDS
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept, name=name, daemon=True)

    @property
    def serving(self) -> int:
        """Connections open and not evicted."""
        with self._lock:
            return sum(not held.ended for held in self._open.values())

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Accept no more connections (those open end within `timeout`)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()
        self._listener.close()
        for waiting in self._line.clear():
            waiting.close()
        self._wake.close()
        self._woken.close()

    def _accept(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            selector.register(self._woken, selectors.EVENT_READ)
            while not self._stopping.is_set():
                self._let_in_from_line()
                ready = {key.fileobj for key, _ in selector.select(POLL_SECONDS)}
                if self._woken in ready:
                    with contextlib.suppress(BlockingIOError):
                        self._woken.recv(4096)
                if self._listener not in ready:
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
                self._line.arrived(str(peer[0]))
                self._admit(connection, str(peer[0]))

    def _slack_full(self) -> bool:
        with self._lock:
            return len(self._open) >= self.connections + self.slack

    def _admit(self, connection: socket.socket, client: str) -> None:
        if self._line or self._slack_full():
            self._get_in_line(connection, client)
            return
        self._start(connection, client)

    def _get_in_line(self, connection: socket.socket, client: str) -> None:
        """Wait for a slot without a thread; a connection the full line gives up (the
        busiest peer's newest, perhaps this one) is closed."""
        leaving = self._line.join(connection, client, self._held_unanswered())
        if leaving is not None:
            leaving.close()
            self._log_flood(time.monotonic(), "a waiting connection closed: the line is full")

    def _let_in_from_line(self) -> None:
        """Start the least busy peer's oldest waiting connections while slots are free;
        close those that waited longer than `timeout`."""
        for late in self._line.expired():
            late.close()
        while len(self._line) and not self._slack_full():
            entry = self._line.next(self._held_unanswered())
            assert entry is not None  # the line is not empty
            self._start(*entry)

    def _held_unanswered(self) -> collections.Counter[str]:
        """What each peer holds that is still to be answered: for the line, an answered
        connection is done (its close alone is left)."""
        with self._lock:
            return collections.Counter(
                held.peer for held in self._open.values() if not held.answered
            )

    def _start(self, connection: socket.socket, client: str) -> None:
        if not self._take_slot(connection, client):
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
            self._release(connection)
            connection.close()

    def _take_slot(self, connection: socket.socket, client: str) -> bool:
        """Register `connection` (evicting the busiest peer's oldest when all slots are
        taken), or refuse it."""
        now = time.monotonic()
        with self._lock:
            if len(self._open) >= self.connections + self.slack:
                return self._refuse(now, client)
            serving = [held for held in self._open.values() if not held.ended]
            held_by = collections.Counter(held.peer for held in serving)
            if held_by[client] >= self.per_client:
                return self._refuse(now, client)
            if len(serving) >= self.connections:
                victim = slot_to_take(serving, client)
                if victim is None:
                    return self._refuse(now, client)
                self._evict(victim, now)
            self._open[connection] = _Connection(connection, client, now)
            return True

    def _evict(self, victim: _Connection, now: float) -> None:
        # Under the lock, and only for a registered socket: its thread unregisters it
        # (_release) before closing it, so this never shuts down a reused descriptor.
        victim.ended = True
        self.evicted += 1
        self._log_flood(now, f"the oldest connection of {victim.peer} ended for a newcomer")
        with contextlib.suppress(OSError):  # the peer has gone already: its thread sees that
            victim.sock.shutdown(socket.SHUT_RDWR)  # wakes its thread, blocked on it

    def _refuse(self, now: float, client: str) -> bool:
        self._log_flood(now, f"a connection from {client} refused")
        return False

    def _log_flood(self, now: float, what: str) -> None:
        if now - self._flood_logged >= FLOOD_LOG_SECONDS:
            self._flood_logged = now
            logger.warning(
                "%s: %d connections open, %s (a flood? a NetworkPolicy can limit who "
                "reaches this port); said at most once a minute",
                self.name,
                len(self._open),
                what,
            )
        else:
            logger.debug("%s: %s", self.name, what)

    def _release(self, connection: socket.socket) -> None:
        with self._lock:
            del self._open[connection]
        with contextlib.suppress(OSError):  # full (a wake-up is pending anyway) or closed
            self._wake.send(b"\0")

    def _answered(self, connection: socket.socket) -> None:
        with self._lock:
            self._open[connection].answered = True

    def _serve(self, connection: socket.socket, client: str) -> None:
        deadline = time.monotonic() + self.timeout
        try:
            try:
                head = _read_head(connection, deadline)
                head_only, (status, headers, body) = _answer(head, self.routes)
            except _Refused as refusal:
                head_only, body = refusal.head_only, f"{refusal.status.phrase}\n".encode()
                status, headers = refusal.status, {"Content-Type": _TEXT, **refusal.headers}
            _send(connection, deadline, status, headers, body, head_only)
            self._answered(connection)
            _close(connection, deadline)
        except OSError as error:  # too slow (TimeoutError), reset, gone or evicted
            logger.debug("%s: connection from %s dropped: %s", self.name, client, error)
        except Exception:
            logger.exception("%s: answering %s failed", self.name, client)
        finally:
            self._release(connection)
            connection.close()


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


def _answer(head: bytes, routes: Mapping[str, Route]) -> tuple[bool, Answer]:
    """(whether only the headers go back, the route's answer) for `head`."""
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
    return head_only, route(url.query, fields)


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
