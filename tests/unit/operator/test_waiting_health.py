"""A replica waiting to lead answers its liveness probe, and a flood of slow connections
to that port neither takes a thread each nor keeps the probe out for long."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request

from cronlock_operator.runtime import leader


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def healthz(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
        return int(answer.status)


def test_slow_connections_are_bounded_and_the_probe_is_answered_once_they_time_out() -> None:
    port = free_port()
    with leader.healthy_while_waiting(f"http://127.0.0.1:{port}/healthz"):
        assert healthz(port) == 200
        threads = threading.active_count()
        slow = []
        for _ in range(100):
            connection = socket.create_connection(("127.0.0.1", port), 2)
            connection.sendall(b"GET /healthz HTTP/1.1\r\n")  # never finished
            slow.append(connection)
        time.sleep(0.5)
        assert threading.active_count() <= threads + leader.WAITING_CONNECTIONS
        started = time.monotonic()
        answered = None
        while answered is None and time.monotonic() - started < 10:
            with contextlib.suppress(OSError):
                answered = healthz(port)
            time.sleep(0.1)
        assert answered == 200
        assert time.monotonic() - started < leader.WAITING_TIMEOUT + 3
        for connection in slow:
            connection.close()
