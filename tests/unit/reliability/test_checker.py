"""The checker's own parts, without a cluster: the delaying relay and the recovery bookkeeping."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.reliability.checker import Fault, _Start, _TrialState
from tests.reliability.proxy import DelayingProxy


@pytest.fixture
def echo_server() -> Iterator[int]:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)

    def serve() -> None:
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        with connection:
            while data := connection.recv(4096):
                connection.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(listener.getsockname()[1])
    listener.close()
    thread.join(timeout=5)


def proxy_client(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def round_trip(client: socket.socket) -> float:
    started = time.monotonic()
    client.sendall(b"ping")
    received = b""
    while len(received) < 4:
        received += client.recv(4)
    assert received == b"ping"
    return time.monotonic() - started


def test_the_relay_passes_bytes_through_and_delays_each_direction(echo_server: int) -> None:
    with DelayingProxy("127.0.0.1", echo_server) as proxy, proxy_client(proxy.port) as client:
        assert round_trip(client) < 0.5
        proxy.delay = 0.4
        # 0.4 s there and 0.4 s back.
        assert 0.75 < round_trip(client) < 3.0
        proxy.delay = 0.0
        assert round_trip(client) < 0.5


def test_the_relay_refuses_a_non_loopback_upstream() -> None:
    with pytest.raises(ValueError, match="loopback"):
        DelayingProxy("192.0.2.1", 443)


def test_recovery_counts_from_when_the_stopped_holder_was_last_seen(tmp_path: object) -> None:
    state = _TrialState(tmp_path / "events.jsonl")  # type: ignore[operator]
    state.starts = [_Start(pid=10, run=9, token=1, start=100.0, last_seen=112.0, ended=True)]
    fault = Fault("kill-holder", 0, fired=101.0, cleared=101.0)
    assert state.recovery(fault) is None  # nobody started since: not recovered yet
    state.starts.append(_Start(pid=20, run=19, token=2, start=115.0, last_seen=116.0))
    assert state.recovery(fault) == pytest.approx(3.0)
