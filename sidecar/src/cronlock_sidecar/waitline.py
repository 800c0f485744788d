"""The line a connection waits in when a small server is full, and the order it leaves by.

Both cronlock servers any pod can reach (the sidecar's port, pod/endpoints.py; the
operator's /metrics and liveness ports, cronlock_operator.runtime.httpserver) cap the
connections they serve, and when every slot is taken a newcomer from a peer holding fewer
than the busiest takes the busiest peer's oldest slot. The evicted connection's thread
must still let go of it, and on a loaded machine that takes a while: a newcomer arriving
meanwhile used to be reset, the kubelet's probe among them (CI's run of 1a627ad reset one
/metrics scrape of 56 so). It waits here instead, without a thread, and leaves in a fair
order:

- a freed slot goes to the least busy peer's oldest connection in line;
- when the line is longer than `length`, the busiest peer's newest connection leaves it
  (closed by the server, perhaps the one that just came);
- a connection in line longer than `timeout` leaves it.

"Busy" is what a peer holds (the server says what counts) plus what it has in line, then
how often it connected lately: a count of its connections halved every second. So a
kubelet probing every few seconds is never the busiest beside a pod reconnecting in a loop,
even when both hold as many. Standard library only, no I/O: the server closes what leaves.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, Protocol, TypeVar

Waiting = TypeVar("Waiting")


class Slot(Protocol):
    """A connection a server serves, as the eviction rule sees it."""

    @property
    def peer(self) -> str: ...

    @property
    def opened(self) -> float: ...

    @property
    def answered(self) -> bool: ...


Served = TypeVar("Served", bound=Slot)


def slot_to_take(serving: Sequence[Served], peer: str) -> Served | None:
    """Every slot taken: the one a newcomer from `peer` takes, the busiest peer's oldest
    (one already answered first: only its close is left), when `peer` holds fewer than
    that peer; None when it does not, and the newcomer waits or is refused. Both servers'
    one rule (the sidecar's port, the operator's /metrics and liveness ports)."""
    if not serving:
        return None
    held = collections.Counter(slot.peer for slot in serving)
    busiest = max(held.values())
    if held[peer] >= busiest:
        return None
    return min(
        (slot for slot in serving if held[slot.peer] == busiest),
        key=lambda slot: (not slot.answered, slot.opened),
    )


class WaitLine(Generic[Waiting]):
    """Connections (whatever the server keeps for one) waiting for a slot, by peer."""

    def __init__(
        self,
        length: int,
        timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.length = length
        self.timeout = timeout
        self._clock = clock
        self._entries: list[tuple[Waiting, str, float]] = []
        self._arrivals: collections.Counter[str] = collections.Counter()
        self._decayed = clock()

    def __len__(self) -> int:
        return len(self._entries)

    def arrived(self, peer: str) -> None:
        """Count a connection from `peer` (every one the server accepts, in line or not)."""
        self._decay()
        self._arrivals[peer] += 1

    def join(self, waiting: Waiting, peer: str, held: Mapping[str, int]) -> Waiting | None:
        """Put `waiting` at the end of the line; return what had to leave it, if anything
        (the busiest peer's newest, perhaps `waiting` itself)."""
        self._entries.append((waiting, peer, self._clock()))
        if len(self._entries) <= self.length:
            return None
        busy = self._busy(held)
        leaving = max(self._entries, key=lambda entry: (busy(entry[1]), entry[2]))
        self._entries.remove(leaving)
        return leaving[0]

    def next(self, held: Mapping[str, int]) -> tuple[Waiting, str] | None:
        """Take the least busy peer's oldest connection out of the line (None: empty)."""
        if not self._entries:
            return None
        busy = self._busy(held)
        entry = min(self._entries, key=lambda entry: (busy(entry[1]), entry[2]))
        self._entries.remove(entry)
        return entry[0], entry[1]

    def expired(self) -> list[Waiting]:
        """Take out the connections that waited longer than `timeout`."""
        now = self._clock()
        late = [entry for entry in self._entries if now - entry[2] > self.timeout]
        for entry in late:
            self._entries.remove(entry)
        return [entry[0] for entry in late]

    def seconds_to_expiry(self) -> float | None:
        """Until the oldest connection in line has waited `timeout` (None: empty)."""
        if not self._entries:
            return None
        return max(0.0, min(entry[2] for entry in self._entries) + self.timeout - self._clock())

    def clear(self) -> list[Waiting]:
        """Take every connection out of the line."""
        left = [entry[0] for entry in self._entries]
        self._entries.clear()
        return left

    def _busy(self, held: Mapping[str, int]) -> Callable[[str], tuple[int, int]]:
        self._decay()
        in_line = collections.Counter(entry[1] for entry in self._entries)
        return lambda peer: (held.get(peer, 0) + in_line[peer], self._arrivals[peer])

    def _decay(self) -> None:
        now = self._clock()
        if now - self._decayed < 1.0:
            return
        halvings = int(now - self._decayed)
        self._decayed += halvings
        self._arrivals = collections.Counter(
            {peer: count >> halvings for peer, count in self._arrivals.items() if count >> halvings}
        )
