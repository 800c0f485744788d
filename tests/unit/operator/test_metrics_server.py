"""The operator's /metrics server: it answers scrapes as before, no client holds more of it
than its caps, for longer than its timeout (security review N5), and when every slot is
taken a newcomer takes the busiest peer's oldest instead of being refused (L10)."""

from __future__ import annotations

import contextlib
import http.client
import selectors
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from http import HTTPStatus

import pytest

from cronlock_operator import selfcheck
from cronlock_operator.runtime import metrics
from cronlock_operator.runtime.httpserver import Answer, BoundedServer
from tests.support.flood import Peak
from tests.support.kube import wait_for

# A request whose headers never end: the client that sends it holds the connection.
SLOW = b"GET /metrics HTTP/1.1\r\nHost: operator\r\n"
FLOOD = 200
SLACK = 2.0  # seconds a loaded machine may add to any bound below


@pytest.fixture
def server() -> Iterator[BoundedServer]:
    server = metrics.serve(0, "127.0.0.1")
    yield server
    server.stop()


def scrape(
    port: int, source: str = "127.0.0.1", method: str = "GET", path: str = "/metrics"
) -> tuple[int, http.client.HTTPMessage, bytes]:
    """(status, headers, body) of one request, as a scraper on `source` sees it."""
    connection = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=SLACK, source_address=(source, 0)
    )
    try:
        connection.request(method, path)
        answer = connection.getresponse()
        return answer.status, answer.headers, answer.read()
    finally:
        connection.close()


def exchange(port: int, request: bytes) -> bytes:
    """All the server sends back to `request` before it closes the connection (a
    TimeoutError when it keeps it open for SLACK seconds)."""
    with socket.create_connection(("127.0.0.1", port), timeout=SLACK) as client:
        client.sendall(request)
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    return answer


def server_threads() -> int:
    return sum(thread.name.startswith("cronlock-metrics") for thread in threading.enumerate())


def open_slow(port: int, sources: list[str]) -> list[socket.socket]:
    clients = []
    for source in sources:
        client = socket.create_connection(
            ("127.0.0.1", port), timeout=SLACK, source_address=(source, 0)
        )
        clients.append(client)
        with contextlib.suppress(OSError):  # already closed: one over a cap
            client.sendall(SLOW)
    return clients


def closing_times(clients: list[socket.socket], deadline: float) -> list[float]:
    """When (time.monotonic()) the server closed each client's connection, waiting for
    them until `deadline`; the list is shorter when some were still open then."""
    closed: list[float] = []
    with selectors.DefaultSelector() as selector:
        for client in clients:
            client.setblocking(False)
            selector.register(client, selectors.EVENT_READ)
        while selector.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                client = key.fileobj
                assert isinstance(client, socket.socket)
                try:
                    if client.recv(4096):
                        continue  # an answer; the close comes next
                except ConnectionResetError:
                    pass
                closed.append(time.monotonic())
                selector.unregister(client)
    return closed


def test_metrics_answers_with_what_the_registry_holds(server: BoundedServer) -> None:
    before = metrics.registry.get_sample_value("cronlock_guarded_cronjobs") or 0.0
    metrics.guarded_cronjobs.set(7)
    try:
        status, headers, body = scrape(server.port)
        _, head_headers, head_body = scrape(server.port, method="HEAD")
    finally:
        metrics.guarded_cronjobs.set(before)
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    assert b"\ncronlock_guarded_cronjobs 7.0\n" in body
    assert head_body == b""
    assert head_headers["Content-Length"] == headers["Content-Length"]
    # What the chart's `helm test` (selfcheck) asks of it.
    assert selfcheck.scrape(selfcheck.Endpoint("127.0.0.1", server.port)).problem is None


def test_prometheus_still_gets_openmetrics_when_it_asks(server: BoundedServer) -> None:
    answer = exchange(
        server.port,
        b"GET /metrics HTTP/1.1\r\nHost: operator\r\n"
        b"Accept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n\r\n",
    )
    assert b"\r\nContent-Type: application/openmetrics-text; version=1.0.0" in answer
    assert answer.endswith(b"# EOF\n")


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/", 404), ("GET", "/healthz", 404), ("POST", "/metrics", 405)],
)
def test_only_get_and_head_of_metrics_are_served(
    server: BoundedServer, method: str, path: str, status: int
) -> None:
    answered, _, body = scrape(server.port, method=method, path=path)
    assert answered == status
    assert b"cronlock_" not in body


def test_a_flood_from_one_pod_holds_few_threads_and_prometheus_still_scrapes(
    server: BoundedServer,
) -> None:
    start = time.monotonic()
    with Peak(server_threads, every=0.005) as threads:
        flood = open_slow(server.port, ["127.0.0.1"] * FLOOD)
        try:
            began = time.monotonic()
            status, _, body = scrape(server.port, source="127.0.0.2")  # Prometheus
            scraped = time.monotonic() - began
            closed = closing_times(flood, deadline=start + metrics.TIMEOUT + SLACK)
        finally:
            for client in flood:
                client.close()

    assert status == 200
    assert b"cronlock_build_info" in body
    assert scraped < SLACK
    # The accept thread, the pod's few connections and the scrape; not one per connection.
    assert threads.peak <= 1 + metrics.CONNECTIONS_PER_CLIENT + 1
    assert len(closed) == FLOOD  # none outlived the timeout
    # Those over the cap were closed at once, not after the timeout.
    at_once = [t for t in closed if t - start < metrics.TIMEOUT / 2]
    assert len(at_once) >= FLOOD - metrics.CONNECTIONS_PER_CLIENT


def test_a_flood_from_many_pods_holds_at_most_the_cap_and_ends_with_the_timeout(
    server: BoundedServer,
) -> None:
    # 50 pods, 4 connections each (loopback answers on all of 127/8).
    sources = [f"127.0.1.{1 + index // 4}" for index in range(FLOOD)]
    start = time.monotonic()
    with Peak(server_threads, every=0.005) as threads:
        flood = open_slow(server.port, sources)
        try:
            closed = closing_times(flood, deadline=start + metrics.TIMEOUT + SLACK)
        finally:
            for client in flood:
                client.close()
        status = 0
        while status != 200 and time.monotonic() < start + metrics.TIMEOUT + 2 * SLACK:
            with contextlib.suppress(OSError, http.client.HTTPException):
                status, _, _ = scrape(server.port, source="127.0.0.2")
        scraped = time.monotonic() - start

    # Newcomers evict: the cap, and at most `slack` evicted threads on their way out.
    assert threads.peak <= 1 + metrics.CONNECTIONS + server.slack
    assert len(closed) == FLOOD
    assert max(closed) - start <= metrics.TIMEOUT + SLACK
    assert status == 200
    assert scraped <= metrics.TIMEOUT + 2 * SLACK


def test_keep_alive_is_not_honoured(server: BoundedServer) -> None:
    request = b"GET /metrics HTTP/1.1\r\nHost: operator\r\nConnection: keep-alive\r\n\r\n"
    began = time.monotonic()
    answer = exchange(server.port, request * 2)  # a second request on the same connection
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 1
    assert b"\r\nConnection: close\r\n" in answer
    # Closed after the one answer, well before the timeout.
    assert time.monotonic() - began < metrics.TIMEOUT


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /metrics?" + b"a" * 65536 + b" HTTP/1.1\r\n\r\n", b"414"),
        (b"GET /metrics HTTP/1.1\r\n" + b"X-Padding: " + b"a" * 16384 + b"\r\n\r\n", b"431"),
    ],
    ids=["request-line", "headers"],
)
def test_an_oversized_request_is_refused(
    server: BoundedServer, request_bytes: bytes, status: bytes
) -> None:
    answer = exchange(server.port, request_bytes)
    assert answer.startswith(b"HTTP/1.1 " + status + b" ")
    assert b"cronlock_" not in answer


def still_open(clients: list[socket.socket]) -> list[bool]:
    """Whether the server has yet to close each client's connection (looked at now)."""
    answer = []
    for client in clients:
        client.setblocking(False)
        try:
            answer.append(client.recv(4096) != b"")
        except BlockingIOError:
            answer.append(True)
        except ConnectionResetError:
            answer.append(False)
    return answer


def held(server: BoundedServer, count: int) -> bool:
    return server.serving == count


def test_a_33rd_peer_scrapes_at_once_taking_the_oldest_of_the_busiest(
    server: BoundedServer,
) -> None:
    # 8 pods, 4 slow connections each: every slot taken (the review's L10), for 5 s at a time.
    sources = [f"127.0.1.{1 + index // 4}" for index in range(metrics.CONNECTIONS)]
    flood = open_slow(server.port, sources)
    try:
        wait_for(lambda: held(server, metrics.CONNECTIONS), SLACK, "every slot taken")
        began = time.monotonic()
        status, _, body = scrape(server.port, source="127.0.0.2")  # Prometheus
        scraped = time.monotonic() - began
        wait_for(lambda: not still_open(flood[:1])[0], SLACK, "the oldest connection closed")
        left_open = still_open(flood[1:])
    finally:
        for client in flood:
            client.close()

    assert status == 200
    assert b"cronlock_build_info" in body
    assert scraped < metrics.TIMEOUT / 2  # not after a slot timed out
    assert all(left_open), "only the oldest connection of a busiest peer goes"
    assert server.evicted == 1


def _ok(query: str, fields: Mapping[str, str]) -> Answer:
    return HTTPStatus.OK, {}, b"ok\n"


@pytest.fixture
def small_server() -> Iterator[BoundedServer]:
    """6 slots, 4 per address."""
    server = BoundedServer(
        "127.0.0.1", 0, {"/": _ok}, timeout=10.0, connections=6, per_client=4, name="small"
    )
    server.start()
    yield server
    server.stop()


def test_the_busiest_peer_gives_up_its_oldest_not_the_oldest_of_all(
    small_server: BoundedServer,
) -> None:
    quiet = open_slow(small_server.port, ["127.0.2.2"] * 2)  # the oldest of all
    wait_for(lambda: held(small_server, 2), SLACK, "the quiet peer's 2")
    busy = open_slow(small_server.port, ["127.0.2.1"] * 4)
    wait_for(lambda: held(small_server, 6), SLACK, "every slot taken")
    first: list[socket.socket] = []
    second: list[socket.socket] = []
    try:
        first = open_slow(small_server.port, ["127.0.2.3"])
        wait_for(lambda: not still_open(busy[:1])[0], SLACK, "the busy peer's oldest closed")
        assert still_open(quiet + busy[1:] + first) == [True] * 6
        # Now 3, 2, 1: the busy peer is still the busiest, and loses its next oldest.
        second = open_slow(small_server.port, ["127.0.2.4"])
        wait_for(lambda: not still_open(busy[1:2])[0], SLACK, "the busy peer's next closed")
        assert still_open(quiet + busy[2:] + first + second) == [True] * 6
        assert small_server.evicted == 2
    finally:
        for client in quiet + busy + first + second:
            client.close()


def test_a_peer_as_busy_as_the_busiest_is_refused_and_evicts_nobody(
    small_server: BoundedServer,
) -> None:
    clients = open_slow(small_server.port, ["127.0.2.1"] * 3 + ["127.0.2.2"] * 3)
    wait_for(lambda: held(small_server, 6), SLACK, "every slot taken")
    extra: list[socket.socket] = []
    try:
        # A fourth from either address: it holds as many as the busiest, so it waits its
        # turn rather than take one of its own or its equal's.
        extra = open_slow(small_server.port, ["127.0.2.1"])
        wait_for(lambda: not still_open(extra)[0], SLACK, "the fourth closed")
        assert still_open(clients) == [True] * 6
        assert small_server.evicted == 0
    finally:
        for client in clients + extra:
            client.close()


def test_a_newcomer_finding_no_room_waits_in_line_and_the_quiet_peer_goes_first() -> None:
    """Every slot taken and no slack for evicted threads (as when they are slow to leave on
    a loaded machine): a newcomer is not reset, it waits without a thread for the slot.
    The line is as long as the slots (1 here): when it is full, the peer that connects
    most loses its place, even to one that came after it."""
    timeout = 2.0
    server = BoundedServer(
        "127.0.0.1",
        0,
        {"/": _ok},
        timeout=timeout,
        connections=1,
        per_client=1,
        name="lined",
        slack=0,
    )
    server.start()
    holder: list[socket.socket] = []
    loud: list[socket.socket] = []
    try:
        holder = open_slow(server.port, ["127.0.2.1"])  # holds the slot until its timeout
        wait_for(lambda: held(server, 1), SLACK, "the one slot taken")
        for _ in range(3):  # a pod reconnecting in a loop: one of them keeps the place
            loud += open_slow(server.port, ["127.0.2.5"])
        time.sleep(0.2)
        began = time.monotonic()
        quiet = http.client.HTTPConnection(
            "127.0.0.1", server.port, timeout=4 * timeout, source_address=("127.0.2.2", 0)
        )
        try:
            quiet.request("GET", "/")
            answer = quiet.getresponse()
            status, body = answer.status, answer.read()
        finally:
            quiet.close()
        waited = time.monotonic() - began
        assert (status, body) == (200, b"ok\n"), "reset or refused instead of waiting"
        # Let in when the holder's slot freed; after a loud one (its slow head holding the
        # slot for a whole timeout more), it would have waited twice as long.
        assert waited < 2 * timeout - 0.2, f"waited {waited:.2f}s: not first in line"
        assert still_open(loud) == [False] * 3, "the loud one kept its place in line"
    finally:
        for client in holder + loud:
            client.close()
        server.stop()
