"""The sidecar's port: bound when the sidecar starts, served once it has decided.

Binding first means a taken port fails the sidecar (exit 78) before it takes a Lease.
The HTTP server itself (pod/endpoints.py, with http.server and its worker threads) starts
only when the holder asks (`start`, after the decision is written): its imports and
threads cost about a fifth of the sidecar's start, and that start is on every guarded
run's way to its work (docs/PERFORMANCE.md). Nothing asks the port before then: the
kubelet probes `/held` from the work's containers, which start after the decision; the
kernel queues any earlier connection on the listening socket until the server accepts it.
"""

from __future__ import annotations

import socket

from cronlock_sidecar.pod.state import SidecarState

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cronlock_sidecar.pod.endpoints import Endpoints

# Connections not yet accepted; each may hold up to a receive window (~64 KiB) of kernel
# memory charged to the pod, so the queue is long enough for a burst, no longer.
ACCEPT_BACKLOG = 128


def listen(port: int, host: str = "0.0.0.0") -> socket.socket:
    """A TCP socket bound to host:port and listening (port 0: one the kernel picks)."""
    return socket.create_server((host, port), backlog=ACCEPT_BACKLOG)


class Serving:
    """The port from now on, the endpoints from `start` until `stop`."""

    def __init__(self, state: SidecarState, port: int, host: str = "0.0.0.0") -> None:
        self.state = state
        self.listener = listen(port, host)
        self.endpoints: Endpoints | None = None
        self._stopped = False

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def start(self) -> None:
        """Serve from now on; again is a no-op."""
        if self.endpoints is not None or self._stopped:
            return
        from cronlock_sidecar.pod.endpoints import Endpoints

        self.endpoints = Endpoints(self.state, self.listener)
        self.endpoints.start()

    def stop(self) -> None:
        self._stopped = True
        if self.endpoints is not None:
            self.endpoints.stop()  # closes the listener too
        else:
            self.listener.close()
