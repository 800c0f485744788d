"""A flood of oversized, never-ending requests (security review M3), and the RSS of a
process under it, for the unit and integration tests of the operator's HTTP ports."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# Each request: 120 header lines of 8 KB that never end (about 1 MB).
HEADER = b"X-" + b"a" * 20 + b": " + b"b" * 8100 + b"\r\n"
HEADER_LINES = 120
CONNECTIONS = 200


def rss_mib(pid: int | str = "self") -> float:
    """VmRSS of process `pid` in MiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


@dataclass
class HeaderFlood:
    """CONNECTIONS connections to 127.0.0.1:`port`, 4 from each address of `network`
    (a /24 of loopback, "127.0.3"), each sending GET `path` with HEADER_LINES headers as
    fast as the server reads them, reopened as soon as the server closes it, for
    `seconds`."""

    port: int
    path: str
    seconds: float
    network: str = "127.0.3"
    opened: int = 0
    sent: int = 0

    def run(self) -> None:
        payload = memoryview(
            f"GET {self.path} HTTP/1.1\r\nHost: operator\r\n".encode() + HEADER * HEADER_LINES
        )
        sources = [f"{self.network}.{1 + index // 4}" for index in range(CONNECTIONS)]
        clients: list[tuple[socket.socket, int] | None] = [None] * CONNECTIONS
        deadline = time.monotonic() + self.seconds
        try:
            while time.monotonic() < deadline:
                for index, held in enumerate(clients):
                    clients[index] = self._push(held, sources[index], payload)
                time.sleep(0.001)
        finally:
            for held in clients:
                if held is not None:
                    held[0].close()

    def _push(
        self, held: tuple[socket.socket, int] | None, source: str, payload: memoryview
    ) -> tuple[socket.socket, int] | None:
        """Send what the socket takes now; None once the server has closed it."""
        if held is None:
            try:
                held = (self._open(source), 0)
            except OSError:
                return None  # refused (a full backlog): next round
        client, offset = held
        try:
            if offset < len(payload):
                count = client.send(payload[offset : offset + 65536])
                self.sent += count
                return client, offset + count
            if client.recv(4096) == b"":
                client.close()
                return None
        except BlockingIOError:
            return held
        except OSError:
            client.close()
            return None
        return held

    def _open(self, source: str) -> socket.socket:
        client = socket.create_connection(
            ("127.0.0.1", self.port), timeout=2.0, source_address=(source, 0)
        )
        client.setblocking(False)
        self.opened += 1
        return client


@dataclass
class Peak:
    """The highest value `sample()` gave while entered, sampled every `every` seconds (a
    process's RSS, a server's thread count)."""

    sample: Callable[[], float]
    every: float = 0.01
    peak: float = 0.0
    _done: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Peak:
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.wait(self.every):
            self.peak = max(self.peak, self.sample())


def peak_rss(pid: int | str = "self") -> Peak:
    """The highest RSS (MiB) of `pid` while entered."""
    return Peak(lambda: rss_mib(pid))
