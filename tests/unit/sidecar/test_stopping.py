"""A stop requested from a signal handler reaches the holder even mid `Event.wait()`."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from cronlock_sidecar.pod.stopping import StopPipe


@pytest.fixture
def usr1_handler() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, previous)


@pytest.mark.timeout(10)
@pytest.mark.usefixtures("usr1_handler")
def test_a_signal_arriving_while_the_main_thread_holds_the_events_lock_still_stops() -> None:
    stop = threading.Event()
    pipe = StopPipe(stop)
    signal.signal(signal.SIGUSR1, lambda _signum, _frame: pipe.request())

    # The moment that deadlocked `stop.set()` in a handler: the main thread inside the
    # event's own lock (as in `Event.wait()`) when the handler runs.
    with stop._cond:  # recreating the interrupted state on purpose
        os.kill(os.getpid(), signal.SIGUSR1)
        for _ in range(1000):  # bytecodes: the handler runs here, inside the lock
            pass

    assert stop.wait(timeout=5)
