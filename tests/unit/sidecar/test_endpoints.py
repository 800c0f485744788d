"""The sidecar's HTTP port under a flood: bounded threads and connections, /held still answered."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from cronlock_sidecar.pod.endpoints import (
    CONNECTION_SECONDS,
    EVICTION_SLACK,
    MAX_CONNECTIONS,
    Endpoints,
    _Connections,
)
from cronlock_sidecar.pod.serving import Serving, listen
from cronlock_sidecar.pod.state import SidecarState

# The kubelet's probe gives up after 1 s, and one miss kills the run.
PROBE_TIMEOUT = 1.0
KUBELET_REQUEST = (
    b"GET /held HTTP/1.1\r\nHost: 10.244.1.7:8484\r\nUser-Agent: kube-probe/1.31\r\n"
    b"Accept: */*\r\nConnection: close\r\n\r\n"
)
# Another loopback address stands for the node's: the kubelet probes from there.
NODE_ADDRESS = "127.0.0.2"
FLOOD_ADDRESS = "127.0.0.1"


@pytest.fixture
def threads_before() -> int:
    return threading.active_count()


@pytest.fixture
def endpoints(threads_before: int) -> Iterator[Serving]:
    state = SidecarState()
    state.update(held=True)
    server = Serving(state, 0, host="127.0.0.1")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def flood() -> Iterator[list[socket.socket]]:
    """The attacker's sockets, closed when the test ends."""
    sockets: list[socket.socket] = []
    yield sockets
    for sock in sockets:
        sock.close()


def slow_connection(port: int, source: str = FLOOD_ADDRESS) -> socket.socket:
    """A connection that sends the start of a request line and never finishes it."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    sock.sendall(b"GET /" + b"a" * 1000)
    return sock


def is_closed(sock: socket.socket) -> bool:
    """Whether the server has closed this connection (without answering it)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def exchange(port: int, request: bytes, source: str = FLOOD_ADDRESS, timeout: float = 3) -> bytes:
    """Send `request`, then read until the server closes the connection."""
    with socket.create_connection(
        ("127.0.0.1", port), timeout=timeout, source_address=(source, 0)
    ) as sock:
        answer = b""
        try:
            sock.sendall(request)
            while chunk := sock.recv(65536):
                answer += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass  # closed with part of our request unread: what arrived before still counts
        return answer


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer else 0


@pytest.mark.timeout(15)
def test_a_flood_of_slow_connections_takes_no_more_threads_and_beyond_the_cap_is_closed_at_once(
    endpoints: Serving, threads_before: int, flood: list[socket.socket]
) -> None:
    serving = threading.active_count()
    assert serving - threads_before <= MAX_CONNECTIONS + EVICTION_SLACK + 1
    opened = time.monotonic()
    flood.extend(slow_connection(endpoints.port) for _ in range(200))
    still_open = [sock for sock in flood if not is_closed(sock)]
    while len(still_open) > MAX_CONNECTIONS:
        # At once: before the first ones' time is up, which would close them all anyway.
        assert time.monotonic() - opened < CONNECTION_SECONDS, (
            f"{len(still_open)} of the flood still open after {CONNECTION_SECONDS:g}s"
        )
        time.sleep(0.02)
        still_open = [sock for sock in flood if not is_closed(sock)]
    assert threading.active_count() <= serving  # none started for the flood
    assert still_open, "the cap admitted none"


@pytest.mark.timeout(15)
def test_slow_connections_are_closed_once_their_time_is_up(
    endpoints: Serving, flood: list[socket.socket]
) -> None:
    started = time.monotonic()
    flood.extend(slow_connection(endpoints.port) for _ in range(200))
    while not all(is_closed(sock) for sock in flood):
        assert time.monotonic() - started < CONNECTION_SECONDS + 2.0
        time.sleep(0.05)
    # The ones served were held until their deadline, not closed at once like the rest.
    assert time.monotonic() - started >= CONNECTION_SECONDS - 0.1


@pytest.mark.timeout(15)
def test_a_probe_from_another_address_is_answered_at_once_while_a_flood_fills_the_cap(
    endpoints: Serving, flood: list[socket.socket]
) -> None:
    flood.extend(slow_connection(endpoints.port) for _ in range(200))
    stop = threading.Event()

    def keep_flooding() -> None:
        # A flood that reconnects as fast as its connections are closed.
        while not stop.wait(0.005):
            with contextlib.suppress(OSError):  # refused at once: try again
                flood.append(slow_connection(endpoints.port))

    refill = threading.Thread(target=keep_flooding, daemon=True)
    refill.start()
    try:
        for _ in range(int(CONNECTION_SECONDS * 2 / 0.2)):  # across the slow ones' expiry
            started = time.monotonic()
            answer = exchange(endpoints.port, KUBELET_REQUEST, NODE_ADDRESS, PROBE_TIMEOUT)
            assert time.monotonic() - started < PROBE_TIMEOUT
            assert status(answer) == 200
            assert answer.endswith(b"\r\n\r\nheld\n")
            time.sleep(0.2)
    finally:
        stop.set()
        refill.join()


@pytest.mark.timeout(15)
def test_a_probe_from_the_flooding_address_is_refused_then_answered_once_the_slow_ones_expire(
    endpoints: Serving, flood: list[socket.socket]
) -> None:
    started = time.monotonic()
    flood.extend(slow_connection(endpoints.port) for _ in range(200))
    assert exchange(endpoints.port, KUBELET_REQUEST) == b""  # the cap is full: closed at once
    while status(exchange(endpoints.port, KUBELET_REQUEST)) != 200:
        assert time.monotonic() - started < CONNECTION_SECONDS + 2.0
        time.sleep(0.1)


@pytest.mark.timeout(15)
def test_a_request_dripped_a_header_at_a_time_is_cut_off_at_the_connection_deadline(
    endpoints: Serving,
) -> None:
    # Each header arrives well within the per-read timeout; only the total bound ends it.
    with socket.create_connection(("127.0.0.1", endpoints.port), timeout=5) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /held HTTP/1.1\r\n")
        answer = b""
        try:
            while time.monotonic() - started < CONNECTION_SECONDS + 3:
                sock.sendall(b"X-Slow: 1\r\n")
                time.sleep(0.3)
        except (BrokenPipeError, ConnectionResetError):
            pass
        else:
            answer = sock.recv(1024)
        cut_off = time.monotonic() - started
    assert answer == b""
    assert CONNECTION_SECONDS - 0.1 <= cut_off < CONNECTION_SECONDS + 1.5


def test_an_oversized_request_line_is_refused_with_414(endpoints: Serving) -> None:
    long_path = b"/held?" + b"a" * 5000
    assert status(exchange(endpoints.port, b"GET " + long_path + b" HTTP/1.1\r\n\r\n")) == 414
    # A long but reasonable line is still served.
    fine_path = b"/held?" + b"a" * 3000
    assert status(exchange(endpoints.port, b"GET " + fine_path + b" HTTP/1.1\r\n\r\n")) == 200


@pytest.mark.parametrize(
    "headers",
    [
        b"".join(b"X-Many-%d: 1\r\n" % number for number in range(40)),
        b"X-Large: " + b"a" * 9000 + b"\r\n",
    ],
    ids=["too-many", "too-large"],
)
def test_too_many_or_too_large_headers_are_refused_with_431(
    endpoints: Serving, headers: bytes
) -> None:
    request = b"GET /held HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n"
    assert status(exchange(endpoints.port, request)) == 431


def test_keep_alive_is_not_honoured_one_request_per_connection(endpoints: Serving) -> None:
    keep_alive = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n"
    started = time.monotonic()
    answer = exchange(endpoints.port, keep_alive + keep_alive)  # the second is pipelined
    # Closed after the answer, not left open until the connection's deadline.
    assert time.monotonic() - started < CONNECTION_SECONDS / 2
    assert answer.startswith(b"HTTP/1.0 200 ")
    assert b"\r\nConnection: close\r\n" in answer
    assert answer.count(b"HTTP/1.") == 1
    assert answer.endswith(b"\r\n\r\nok\n")


@pytest.mark.timeout(15)
def test_a_probe_finding_the_slots_and_the_slack_taken_waits_in_line_instead_of_a_reset() -> None:
    """Evicted connections slow to leave (a loaded node) take the slack: the probe waits for
    the next free slot, without a thread, and is answered then, where it was reset before
    (and a reset /held kills the run)."""
    state = SidecarState()
    state.update(held=True)
    endpoints = Endpoints(state, listen(0, "127.0.0.1"))
    server = endpoints._server
    # One slot and no slack: what a flood leaves when its evicted threads have not left yet.
    server.connections = _Connections(limit=1, slack=0, released=server.nudge)
    endpoints.start()
    hog = slow_connection(endpoints.port)  # holds the slot until its deadline
    try:
        deadline = time.monotonic() + 5
        while server.connections.held() != {FLOOD_ADDRESS: 1}:
            assert time.monotonic() < deadline, "the slot never taken"
            time.sleep(0.01)
        # The slot frees at the hog's deadline, 2 s after it came; the probe, in line half a
        # second later, may wait 2 s too: the slot frees well before the probe gives up.
        time.sleep(0.5)
        started = time.monotonic()
        answer = exchange(endpoints.port, KUBELET_REQUEST, NODE_ADDRESS, CONNECTION_SECONDS + 2)
        waited = time.monotonic() - started
        assert status(answer) == 200, "closed instead of waiting in line"
        assert answer.endswith(b"\r\n\r\nheld\n")
        assert waited < CONNECTION_SECONDS  # let in when the hog's slot freed, ~1.5 s
    finally:
        hog.close()
        endpoints.stop()
