"""A stop request from a signal handler, delivered to a threading.Event by another thread.

`Event.set()` takes the event's lock. A signal handler runs on the main thread between
two bytecodes, possibly while that same thread holds the lock inside `Event.wait()`, and
then `set()` waits forever for a lock its own thread holds: the holder kept renewing
after SIGTERM and never released (seen once in about 20 SIGTERMs under load). The
handler only writes a byte to a pipe, which is safe anywhere; a small thread sets the
event.
"""

from __future__ import annotations

import contextlib
import os
import threading


class StopPipe:
    """`request()` is safe in a signal handler; `event` is set soon after."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        threading.Thread(target=self._relay, name="cronlock-stop-relay", daemon=True).start()

    def request(self) -> None:
        with contextlib.suppress(BlockingIOError):  # a full pipe already asks to stop
            os.write(self._write, b"s")

    def _relay(self) -> None:
        os.read(self._read, 1)
        self.event.set()
