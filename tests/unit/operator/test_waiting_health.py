"""The liveness port (/healthz), the operator's own bounded server from start to exit: a
replica waiting to lead answers it, a leader answers it while its loop beats, and a flood
of slow, oversized requests neither grows the process nor keeps the probe out (security
review M3: kopf's server grew by 381 MiB under the same flood)."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from cronlock_operator.runtime import liveness
from cronlock_operator.runtime.httpserver import BoundedServer
from cronlock_operator.runtime.liveness import Liveness
from tests.support.flood import CONNECTIONS as FLOOD
from tests.support.flood import HeaderFlood, Peak, peak_rss, rss_mib
from tests.support.kube import wait_for
from tests.support.ports import free_port

SLACK = 2.0  # seconds a loaded machine may add to any bound below
FLOOD_SECONDS = 3 * liveness.TIMEOUT  # every slot taken, freed and taken again, twice over
RSS_GROWTH_MIB = 40  # the chart gives the operator 256 MiB in all


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def healthz(port: int, source: str = "127.0.0.1") -> tuple[int, dict[str, str]]:
    """(status, JSON body) of one probe from `source`, as the kubelet sends it."""
    connection = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=SLACK, source_address=(source, 0)
    )
    try:
        connection.request("GET", "/healthz")
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        connection.close()


def probe(server: BoundedServer) -> tuple[int, dict[str, str]]:
    """`healthz` as the kubelet sends it, one probe at a time: the next starts only once the
    server has let this one's connection go. A client may hold 2 at once (the flood's cap),
    and on a loaded machine back-to-back probes could otherwise be the third and be refused
    (seen once: `RemoteDisconnected` in a full run)."""
    answer = healthz(server.port)
    wait_for(lambda: server.serving == 0, SLACK, "the probe's connection let go")
    return answer


@contextlib.contextmanager
def serving(alive: Liveness) -> Iterator[BoundedServer]:
    server = liveness.serve(f"http://127.0.0.1:{free_port()}/healthz", alive)
    try:
        yield server
    finally:
        server.stop()


def server_threads() -> int:
    return sum(thread.name.startswith("cronlock-liveness") for thread in threading.enumerate())


def test_a_waiting_replica_is_alive_and_slow_connections_are_bounded() -> None:
    alive = Liveness()
    alive.waiting(True)
    with serving(alive) as server, Peak(server_threads) as threads:
        assert healthz(server.port) == (200, {"state": "waiting", "detail": "waiting to lead"})
        slow = []
        for _ in range(100):
            connection = socket.create_connection(("127.0.0.1", server.port), 2)
            with contextlib.suppress(OSError):  # closed already: over a cap
                connection.sendall(b"GET /healthz HTTP/1.1\r\n")  # never finished
            slow.append(connection)
        wait_for(lambda: server.serving == liveness.CONNECTIONS_PER_CLIENT, SLACK, "2 held")
        # The kubelet, from its node's address, is answered at once ...
        began = time.monotonic()
        assert healthz(server.port, source="127.0.0.2")[0] == 200
        assert time.monotonic() - began < SLACK
        # ... and from the flood's own address once its slow connections time out.
        started = time.monotonic()
        answered = None
        while answered is None and time.monotonic() - started < 10:
            with contextlib.suppress(OSError, http.client.HTTPException):
                answered = healthz(server.port)[0]
            time.sleep(0.1)
        assert answered == 200
        assert time.monotonic() - started < liveness.TIMEOUT + 3
        for connection in slow:
            connection.close()
    # One thread per connection served, not per connection accepted.
    assert threads.peak <= 1 + liveness.CONNECTIONS_PER_CLIENT + 1


def test_a_leader_is_alive_from_its_first_round_until_its_loop_stalls() -> None:
    clock = Clock()
    alive = Liveness(clock)
    with serving(alive) as server:
        status, body = probe(server)
        assert (status, body["state"]) == (503, "starting")  # kopf served nothing yet
        alive.beat()
        clock.now += liveness.BEAT_LIMIT_SECONDS
        assert probe(server) == (200, {"state": "running", "detail": "last round 10.0s ago"})
        clock.now += 0.5
        status, body = probe(server)
        assert (status, body["state"]) == (503, "stalled")
        assert body["detail"].startswith("no round of the due checks for 10.5s (limit 10s)")
        alive.beat()
        assert probe(server)[0] == 200


@pytest.mark.parametrize(
    "url",
    [
        "0.0.0.0:8081/healthz",
        "https://0.0.0.0:8081/healthz",
        "http://0.0.0.0/healthz",
        "http://:1/",
    ],
)
def test_a_liveness_url_that_cannot_be_served_names_the_flag(url: str) -> None:
    with pytest.raises(ValueError, match=r"^--liveness: .* is not http://ADDRESS:PORT/PATH"):
        liveness.endpoint(url)


def test_a_flood_of_oversized_never_ending_requests_keeps_rss_bounded_and_the_probe_answered() -> (
    None
):
    alive = Liveness()
    alive.beat()
    with serving(alive) as server:
        assert healthz(server.port)[0] == 200
        before = rss_mib()
        flood = HeaderFlood(server.port, "/healthz", FLOOD_SECONDS)
        flooding = threading.Thread(target=flood.run, name="flood", daemon=True)
        probes: list[tuple[int, float]] = []
        with peak_rss() as rss, Peak(server_threads) as threads:
            flooding.start()
            # The kubelet's probe, from its own address, all through the flood.
            while flooding.is_alive():
                alive.beat()  # the operator's loop, running
                began = time.monotonic()
                status = 0
                with contextlib.suppress(OSError, http.client.HTTPException):
                    status = healthz(server.port, source="127.0.0.2")[0]
                probes.append((status, time.monotonic() - began))
                time.sleep(0.2)
            flooding.join()
        after = rss_mib()

    print(  # the figures for docs/SECURITY.md (pytest -s)
        f"liveness flood: {flood.opened} connections opened, {flood.sent / 2**20:.0f} MiB "
        f"sent, {server.evicted} evicted; RSS {before:.1f} -> peak {rss.peak:.1f} -> "
        f"{after:.1f} MiB; {len(probes)} probes, slowest {max(t for _, t in probes):.2f}s"
    )
    assert flood.opened >= FLOOD
    assert flood.sent > 100 * 2**20, "the flood never got its headers to the server"
    assert rss.peak - before < RSS_GROWTH_MIB
    # The accept thread, the slots, and at most `slack` evicted ones on their way out.
    assert threads.peak <= 1 + liveness.CONNECTIONS + server.slack
    assert len(probes) >= 10
    # The kubelet restarts the operator after failureThreshold (3, the chart's) probes in a
    # row fail: on a loaded machine one may be slow to be let in, never three in a row.
    answered = [status == 200 and seconds < SLACK for status, seconds in probes]
    assert sum(answered) >= 0.9 * len(probes), probes
    assert not any(not any(answered[index : index + 3]) for index in range(len(answered) - 2)), (
        probes
    )
