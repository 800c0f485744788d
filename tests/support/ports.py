"""A port for a process a test starts: free now, and outside the range connections take theirs from.

A port the kernel hands out for `bind(("127.0.0.1", 0))` comes from
`net.ipv4.ip_local_port_range`, the same range every outgoing connection takes its source
port from. Between the test asking and the started process binding, one of the many
connections the two rings open (kubelet, containerd, the API servers, the stores) may take
it, and the process then fails with EADDRINUSE. Below that range only an explicit bind
takes a port, so one that is free when asked stays free unless another test picks the same
one in the same moment (one chance in thousands, and that test fails loudly).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_SPAN = 10000


def _below_ephemeral() -> range:
    try:
        low, high = (int(field) for field in _RANGE.read_text().split()[:2])
    except (OSError, ValueError):
        low, high = 32768, 60999
    if low - _SPAN >= 1024:
        return range(low - _SPAN, low)
    return range(high + 1, 65536)  # an ephemeral range that starts low: above it


def free_port() -> int:
    """A TCP port nothing is bound to on any address, outside the ephemeral range."""
    ports = _below_ephemeral()
    for _ in range(200):
        port = random.choice(ports)  # noqa: S311 - spreading picks, not a secret
        with socket.socket() as probe:
            try:
                probe.bind(("0.0.0.0", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1} after 200 tries")
