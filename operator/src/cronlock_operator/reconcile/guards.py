"""The guarded CronJobs as the CronJob reconciler keeps them, and the read-only view the
other reconcilers take of them.

The CronJob reconciler (`runtime/cronjobs.py`) alone writes its `GuardBook`; the holder
RBAC reconciler (which guards its Roles grant) and the Lease expiry reconciler (how long a
hold of a Lease is believed) are handed it as a `GuardView`, which has no way to change
it. As with `Readings`, the runtime owns the one instance and this module keeps no state;
each method copies under one lock, as the reconcile workers, the event loop and a metrics
scrape read it from their own threads.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping
from typing import Protocol

from cronlock_operator.objects import Name
from cronlock_operator.reconcile.rbac import Guard


class GuardView(Protocol):
    """The guarded CronJobs, read only."""

    def in_namespace(self, namespace: str) -> frozenset[Guard]:
        """The guards recorded for a namespace's CronJobs."""
        ...

    def refused(self) -> frozenset[Name]:
        """The CronJobs refused because a Lease or Role they need is not cronlock's."""
        ...

    def lease_duration(self, cronjob: Name) -> int | None:
        """The lease duration of a guarded CronJob's lock, once it is reconciled."""
        ...


class GuardBook:
    """Per CronJob: its guard, whether it is refused for a conflict, refused for invalid
    settings (its last injection kept), kept as admitted without the injection (stripped),
    waiting for its holder Role, and its lock's lease duration."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._guards: dict[Name, Guard] = {}
        self._refused: set[Name] = set()
        self._invalid: set[Name] = set()
        self._stripped: set[Name] = set()
        self._waiting: set[Name] = set()
        self._durations: dict[Name, int] = {}

    # --- read (GuardView, and the router's and the metrics' reads) -----------------------
    def in_namespace(self, namespace: str) -> frozenset[Guard]:
        with self._lock:
            return frozenset(
                guard for (space, _), guard in self._guards.items() if space == namespace
            )

    def refused(self) -> frozenset[Name]:
        with self._lock:
            return frozenset(self._refused)

    def lease_duration(self, cronjob: Name) -> int | None:
        with self._lock:
            return self._durations.get(cronjob)

    def guard(self, cronjob: Name) -> Guard | None:
        with self._lock:
            return self._guards.get(cronjob)

    def waiting(self, namespace: str) -> frozenset[Name]:
        """The CronJobs of a namespace waiting for their holder Role to be written."""
        with self._lock:
            return frozenset(key for key in self._waiting if key[0] == namespace)

    def guarded(self) -> int:
        with self._lock:
            return len(self._guards)

    def states(self) -> dict[tuple[str, str], int]:
        """(namespace, state) -> CronJobs: guarded as asked, refused settings, conflict."""
        with self._lock:
            guards, invalid = list(self._guards), set(self._invalid)
            conflict = self._refused | self._stripped
        counts: collections.Counter[tuple[str, str]] = collections.Counter()
        for namespace, _ in invalid:
            counts[namespace, "invalid"] += 1
        for namespace, _ in conflict:
            counts[namespace, "conflict"] += 1
        for key in guards:
            if key not in invalid and key not in conflict:
                counts[key[0], "guarded"] += 1
        return dict(counts)

    # --- write (the CronJob reconciler's alone) ------------------------------------------
    def settle(self, cronjob: Name, *, invalid: bool, guard: Guard | None) -> None:
        """A decision's verdict before any write: invalid settings keep the guard it had;
        valid ones that guard nothing drop it."""
        with self._lock:
            if invalid:
                self._invalid.add(cronjob)
                return
            self._invalid.discard(cronjob)
            if guard is None:
                self._guards.pop(cronjob, None)

    def record(self, cronjob: Name, guard: Guard) -> None:
        """Guarded by this guard: recorded only once its Lease is ensured (consent checked),
        so that no holder RBAC write grants a lock it may not join."""
        with self._lock:
            self._guards[cronjob] = guard

    def set_lease_duration(self, cronjob: Name, duration: int) -> None:
        with self._lock:
            self._durations[cronjob] = duration

    def wait(self, cronjob: Name, waiting: bool) -> None:
        with self._lock:
            if waiting:
                self._waiting.add(cronjob)
            else:
                self._waiting.discard(cronjob)

    def refuse(self, cronjob: Name) -> None:
        """Something it needs is not cronlock's: not guarded."""
        with self._lock:
            self._refused.add(cronjob)
            self._waiting.discard(cronjob)
            self._guards.pop(cronjob, None)

    def accept(self, cronjob: Name) -> None:
        with self._lock:
            self._refused.discard(cronjob)

    def strip(self, cronjob: Name, stripped: bool) -> None:
        with self._lock:
            if stripped:
                self._stripped.add(cronjob)
            else:
                self._stripped.discard(cronjob)

    def forget(self, cronjob: Name) -> bool:
        """A CronJob gone from the cache; True if it was guarded (its grant to take back)."""
        with self._lock:
            for kept in (self._refused, self._invalid, self._stripped, self._waiting):
                kept.discard(cronjob)
            return self._guards.pop(cronjob, None) is not None

    def deleted(self, cronjob: Name) -> None:
        """Its DELETED event: its lease duration no longer counts among its Lease's owners'."""
        with self._lock:
            self._durations.pop(cronjob, None)


class Posted:
    """Per CronJob uid: the last message of each Warning posted, so a replay posts nothing
    again (`cronjobs.once`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._posted: dict[str, dict[str, str]] = {}

    def of(self, uid: str) -> Mapping[str, str]:
        with self._lock:
            return dict(self._posted.get(uid, {}))

    def remember(self, uid: str, updates: Mapping[str, str | None]) -> None:
        """reason -> the message now posted; None forgets the reason."""
        with self._lock:
            posted = self._posted.setdefault(uid, {})
            for reason, message in updates.items():
                if message is None:
                    posted.pop(reason, None)
                else:
                    posted[reason] = message
            if not posted:
                del self._posted[uid]
