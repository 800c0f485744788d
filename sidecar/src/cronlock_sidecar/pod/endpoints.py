"""/held for the liveness probe, /healthz and hand-written /metrics, on a small bounded server.

It serves what pod/state.py's SidecarState says, on the socket pod/serving.py bound.
"""

from __future__ import annotations

import contextlib
import http.server
import io
import logging
import queue
import selectors
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from cronlock_sidecar.contract import HELD_PATH
from cronlock_sidecar.pod.state import SidecarState
from cronlock_sidecar.waitline import WaitLine, slot_to_take

log = logging.getLogger("cronlock_sidecar.endpoints")


# The port is open to every pod in the cluster, and the kubelet's /held probe (period 1 s;
# below a ttl of 52 s timeout 1 s, failureThreshold 1) kills the run the first time it goes
# unanswered. So a flood must cost the sidecar a bounded amount of memory and threads, and
# must still leave room for the probe:
# - At most MAX_CONNECTIONS connections are served at once; more are closed as soon as they
#   are accepted, so the accept loop never waits for a slot.
# - They are served by a fixed set of threads started with the server, not one started per
#   connection: under load, starting a thread stalled the accept loop long enough for a
#   flood to fill the kernel's queue and drop the probe's SYN (retried only a second
#   later). Idle threads cost little resident memory (docs/PERFORMANCE.md).
# - A connection lives at most CONNECTION_SECONDS in all, however slowly its bytes drip in:
#   a probe's request and answer take milliseconds, so 2 s is generous, and it bounds how
#   long a slow client can sit on a slot. (Shorter would free a full server sooner but cut
#   off a client on a congested node; longer would let a flood hold the slots longer.)
# - A short lifetime alone still lets a flood that reconnects at once keep every slot: the
#   probe would lose the race for each freed one. So when all slots are taken, a connection
#   from a peer address holding fewer of them than the busiest peer takes the busiest
#   peer's oldest slot. The kubelet probes from its node's address, one request at a time,
#   so it is always such a peer; to crowd it out a flood needs as many addresses as there
#   are slots, all reconnecting within the probe's few milliseconds.
# - An evicted connection's thread takes microseconds to let go of it; EVICTION_SLACK more
#   threads than MAX_CONNECTIONS cover that, and no connection is admitted beyond them. On
#   a loaded node those microseconds can grow: a newcomer that finds the slack taken waits
#   without a thread in a line (cronlock_sidecar.waitline, the operator's servers' too) of
#   at most MAX_CONNECTIONS, for at most CONNECTION_SECONDS, and a freed slot goes to the
#   least busy peer's oldest there, so the probe is answered late rather than reset.
# - One request per connection (HTTP/1.0, Connection: close), and a request line and
#   headers of a few KiB at most: a probe's whole request is under 200 bytes.
# What this cannot stop is a flood of connections faster than the accept loop can close
# them (thousands a second): the kernel's queue then drops SYNs, the probe's among them.
# Only a NetworkPolicy that admits the node alone to this port prevents that.
MAX_CONNECTIONS = 24
EVICTION_SLACK = 8
CONNECTION_SECONDS = 2.0
MAX_REQUEST_LINE = 4096
MAX_HEADER_BYTES = 8192  # all header lines together
MAX_HEADERS = 32
FLOOD_LOG_SECONDS = 60.0
# Deadlines are checked at most this often; with no connection open the accept loop
# sleeps until a connection or stop() wakes it (an idle sidecar costs no CPU).
SWEEP_SECONDS = 0.05
RETRY_SECONDS = 0.05  # after accept() failed for want of descriptors or buffers


class _Connection:
    __slots__ = ("deadline", "ended", "opened", "peer", "sock")
    # The eviction rule prefers a connection whose answer is sent (waitline.slot_to_take);
    # this server does not tell those apart, so its rule is the busiest peer's oldest.
    answered = False

    def __init__(self, sock: socket.socket, peer: str, opened: float) -> None:
        self.sock = sock
        self.peer = peer
        self.opened = opened
        self.deadline = opened + CONNECTION_SECONDS
        self.ended = False  # timed out or evicted: its thread is on its way out


class _Connections:
    """The open connections: which are served, which must end now, and whose slot to take."""

    def __init__(
        self,
        limit: int = MAX_CONNECTIONS,
        slack: int = EVICTION_SLACK,
        released: Callable[[], None] = lambda: None,
    ) -> None:
        self.limit = limit
        self.slack = slack
        self._released = released  # called when a thread let go of its connection
        self._lock = threading.Lock()
        self._open: dict[socket.socket, _Connection] = {}
        self._flood_logged = -FLOOD_LOG_SECONDS

    def admit(self, sock: socket.socket, peer: str) -> bool:
        """Take a slot for a new connection (evicting a busier peer's oldest), or refuse it."""
        now = time.monotonic()
        with self._lock:
            if len(self._open) >= self.limit + self.slack:
                return self._refuse(now)
            serving = [connection for connection in self._open.values() if not connection.ended]
            if len(serving) >= self.limit:
                victim = slot_to_take(serving, peer)
                if victim is None:
                    return self._refuse(now)
                self._end(victim)
            self._open[sock] = _Connection(sock, peer, now)
            return True

    def release(self, sock: socket.socket) -> None:
        """The connection's thread is done with it (called before the socket is closed)."""
        with self._lock:
            self._open.pop(sock, None)
        self._released()

    def full(self) -> bool:
        """Whether a newcomer would be refused now: the slots and the slack all taken."""
        with self._lock:
            return len(self._open) >= self.limit + self.slack

    def held(self) -> Counter[str]:
        """The connections each peer holds (those on their way out not counted)."""
        with self._lock:
            return Counter(c.peer for c in self._open.values() if not c.ended)

    def expire(self) -> None:
        """End the connections past their deadline, even one blocked reading or writing."""
        now = time.monotonic()
        with self._lock:
            for connection in self._open.values():
                if not connection.ended and connection.deadline <= now:
                    self._end(connection)

    def wait_seconds(self, now: float) -> float | None:
        """Until the next open connection's deadline (None: no connection open)."""
        with self._lock:
            deadlines = [c.deadline for c in self._open.values() if not c.ended]
        if not deadlines:
            return None
        return max(min(deadlines) - now, SWEEP_SECONDS)

    def end_all(self) -> None:
        with self._lock:
            for connection in self._open.values():
                self._end(connection)

    def _end(self, connection: _Connection) -> None:
        # Under the lock, and only for a registered socket: its thread removes it (release)
        # before closing it, so this never shuts down a descriptor number reused since.
        connection.ended = True
        with contextlib.suppress(OSError):  # the peer has gone already: its thread sees that
            connection.sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked on it

    def _refuse(self, now: float) -> bool:
        if now - self._flood_logged >= FLOOD_LOG_SECONDS:
            self._flood_logged = now
            log.warning(
                "http: %d connections open, refusing new ones for now (a flood? a "
                "NetworkPolicy can limit who reaches this port)",
                len(self._open),
            )
        return False


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    # One request per connection: a kept-alive connection would hold a slot between requests.
    protocol_version = "HTTP/1.0"
    timeout = CONNECTION_SECONDS  # each socket operation; the server bounds the whole

    def handle_one_request(self) -> None:
        self.close_connection = True
        try:
            head = self._read_head()
            if head is None:
                return
            socket_file = self.rfile
            # parse_request reads the headers from rfile: give it the bounded copy.
            self.rfile = io.BytesIO(head)
            try:
                self.raw_requestline = self.rfile.readline()
                parsed = self.parse_request()
            finally:
                self.rfile = socket_file
            self.close_connection = True
            if not parsed:
                return  # parse_request has answered 400 or 505
            if self.command != "GET":
                self.send_error(501, f"Unsupported method ({self.command!r})")
                return
            self.do_GET()
            self.wfile.flush()
        except TimeoutError as error:
            self.log_error("Request timed out: %r", error)

    def _read_head(self) -> bytes | None:
        """The request line and header lines, or None once refused or cut short."""
        line = self.rfile.readline(MAX_REQUEST_LINE + 1)
        if len(line) > MAX_REQUEST_LINE:
            self._refuse(414, "Request line too long")
            return None
        if not line.endswith(b"\n"):
            return None  # closed (or ended by the server) before the line was complete
        head = bytearray(line)
        budget = MAX_HEADER_BYTES
        fields = 0
        while True:
            field = self.rfile.readline(budget + 1)
            if len(field) > budget:
                self._refuse(431, "Request headers too large")
                return None
            if not field.endswith(b"\n"):
                return None
            head += field
            if field in (b"\r\n", b"\n"):
                return bytes(head)
            budget -= len(field)
            fields += 1
            if fields > MAX_HEADERS:
                self._refuse(431, "Too many request headers")
                return None

    def _refuse(self, status: int, message: str) -> None:
        # What send_error needs to know of a request it could not parse.
        self.requestline = ""
        self.request_version = ""
        self.command = ""
        self.send_error(status, message)

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
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("http: " + format, *args)


class _Server(http.server.HTTPServer):
    def __init__(self, listener: socket.socket, state: SidecarState) -> None:
        self.state = state
        # A byte on `_wake` wakes the accept loop: a slot freed for the line, or `stop`.
        self._woken, self._wake = socket.socketpair()
        self._woken.setblocking(False)
        self._wake.setblocking(False)
        self.connections = _Connections(released=self.nudge)
        self.line: WaitLine[tuple[socket.socket, Any]] = WaitLine(
            MAX_CONNECTIONS, CONNECTION_SECONDS
        )
        self._admitted: queue.SimpleQueue[tuple[socket.socket, Any] | None] = queue.SimpleQueue()
        # The socket is bound and listening already (serving.listen): take it as it is.
        super().__init__(listener.getsockname()[:2], _Handler, bind_and_activate=False)
        self.socket.close()
        self.socket = listener
        self.server_address = listener.getsockname()[:2]
        # As many as may be admitted, so an admitted connection never waits for a thread.
        self.workers = [
            threading.Thread(target=self._work, name=f"cronlock-http-{number}", daemon=True)
            for number in range(self.connections.limit + self.connections.slack)
        ]

    def serve(self, stop: threading.Event) -> None:
        """Accept until `stop` (and a byte from `nudge`), taking every queued connection
        before waiting again."""
        # Not serve_forever: it waits on select before each accept. A flood must be taken
        # off the kernel's queue as fast as it arrives, or the probe's SYN finds it full.
        self.socket.setblocking(False)
        swept = time.monotonic()
        with selectors.DefaultSelector() as selector:
            selector.register(self.socket, selectors.EVENT_READ)
            selector.register(self._woken, selectors.EVENT_READ)
            while not stop.is_set():
                self._let_in()
                try:
                    request, client_address = self.socket.accept()
                except BlockingIOError:
                    selector.select(self._wait_seconds())
                    with contextlib.suppress(BlockingIOError):
                        self._woken.recv(4096)
                except OSError as error:  # out of descriptors or buffers: wait, then retry
                    log.warning("http: cannot accept a connection: %s", error)
                    stop.wait(RETRY_SECONDS)
                else:
                    self.process_request(request, client_address)
                now = time.monotonic()
                if now - swept >= SWEEP_SECONDS:
                    self.connections.expire()
                    swept = now

    def process_request(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any
    ) -> None:
        assert isinstance(request, socket.socket)  # a TCP server's requests are sockets
        peer = str(client_address[0])
        self.line.arrived(peer)
        if len(self.line) or self.connections.full():
            leaving = self.line.join((request, client_address), peer, self.connections.held())
            if leaving is not None:
                leaving[0].close()
            return
        self._admit(request, client_address)

    def _admit(self, request: socket.socket, client_address: Any) -> None:
        if self.connections.admit(request, str(client_address[0])):
            self._admitted.put((request, client_address))
        else:
            request.close()

    def _let_in(self) -> None:
        """Admit from the line while there is room; close what waited too long."""
        for late, _ in self.line.expired():
            late.close()
        while len(self.line) and not self.connections.full():
            entry = self.line.next(self.connections.held())
            assert entry is not None  # the line is not empty
            self._admit(*entry[0])

    def _wait_seconds(self) -> float | None:
        """Until the next deadline of a connection open or in line (None: none)."""
        waits = [
            wait
            for wait in (
                self.connections.wait_seconds(time.monotonic()),
                self.line.seconds_to_expiry(),
            )
            if wait is not None
        ]
        return max(min(waits), SWEEP_SECONDS) if waits else None

    def nudge(self) -> None:
        """Wake the accept loop (it needs no timeout to notice a freed slot or a stop)."""
        with contextlib.suppress(OSError):  # full (a wake-up is pending) or closed
            self._wake.send(b"\0")

    def _work(self) -> None:
        while (admitted := self._admitted.get()) is not None:
            request, client_address = admitted
            try:
                self.finish_request(request, client_address)
            except OSError as error:  # the peer went away, or the server ended the connection
                log.debug("http: %s: %s", client_address[0], error)
            except Exception:  # a bug answering one request must not cost the server a thread
                log.exception("http: error answering %s", client_address[0])
            finally:
                self.connections.release(request)
                self.shutdown_request(request)

    def server_close(self) -> None:
        super().server_close()
        for waiting, _ in self.line.clear():
            waiting.close()
        self.connections.end_all()
        self._woken.close()
        self._wake.close()
        for _ in self.workers:
            self._admitted.put(None)


class Endpoints:
    """The sidecar's HTTP server, running on a daemon thread."""

    def __init__(self, state: SidecarState, listener: socket.socket) -> None:
        self._server = _Server(listener, state)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._server.serve,
            args=(self._stop,),
            name="cronlock-http",
            daemon=True,
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        for worker in self._server.workers:
            worker.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._server.nudge()
        if self._thread.ident is not None:
            self._thread.join()
        self._server.server_close()
