"""Events posted in the background, in order, so a reconcile does not wait for them.

An Event says what happened; nothing the operator decides depends on it. Posting one
took a third of each injection's round trips, so the workers hand Events to poster
threads: each object's Events go to the same thread, which posts them in the order they
were written (a `Skipped` before its `RepeatedSkips`), retrying a hiccup a few times and
logging what it had to give up. One thread was not enough: at 10,000 CronJobs the
`Injected` Events trailed the injections by half a minute (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import zlib
from collections.abc import Mapping
from typing import Any

from cronlock_operator.kube.calls import KubeCalls
from cronlock_operator.kube.errors import Retry

logger = logging.getLogger(__name__)

ATTEMPTS = 4
FIRST_DELAY = 0.5
# Poster threads; an object's Events always go to the same one, so they stay in order.
POSTERS = 2

_Item = tuple[Mapping[str, Any], str, str, bool] | None


class EventPoster:
    """Threads posting Events through `kube`, each object's first in, first out."""

    def __init__(self, kube: KubeCalls, posters: int = POSTERS) -> None:
        self.kube = kube
        self._queues: list[queue.SimpleQueue[_Item]] = [queue.SimpleQueue() for _ in range(posters)]
        self._threads = [
            threading.Thread(
                target=self._run, args=(items,), name=f"cronlock-events-{index}", daemon=True
            )
            for index, items in enumerate(self._queues)
        ]
        for thread in self._threads:
            thread.start()

    def post(
        self, involved: Mapping[str, Any], reason: str, message: str, warning: bool = False
    ) -> None:
        # Only what the Event names: a backlog of whole CronJobs grows with their size.
        reference = _reference(involved)
        self._queue_of(reference).put((reference, reason, message, warning))

    def stop(self, timeout: float = 5.0) -> None:
        """Post what is waiting (for at most `timeout` seconds in all), then end."""
        for items in self._queues:
            items.put(None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _queue_of(self, reference: Mapping[str, Any]) -> queue.SimpleQueue[_Item]:
        metadata = reference["metadata"]
        # zlib.crc32, not hash(): the same object maps to the same thread in every run.
        key = f"{metadata.get('namespace')}/{metadata.get('name')}".encode()
        return self._queues[zlib.crc32(key) % len(self._queues)]

    def _run(self, items: queue.SimpleQueue[_Item]) -> None:
        while (item := items.get()) is not None:
            involved, reason, message, warning = item
            delay = FIRST_DELAY
            for attempt in range(1, ATTEMPTS + 1):
                try:
                    self.kube.post_event(involved, reason, message, warning=warning)
                    break
                except Retry as error:
                    if attempt == ATTEMPTS:
                        logger.warning("event %s not posted: %s", reason, error)
                    else:
                        time.sleep(delay)
                        delay *= 2
                except Exception:
                    logger.exception("event %s not posted", reason)
                    break


def _reference(involved: Mapping[str, Any]) -> dict[str, Any]:
    metadata = involved["metadata"]
    return {
        "apiVersion": involved.get("apiVersion", "batch/v1"),
        "kind": involved.get("kind", "CronJob"),
        "metadata": {key: metadata.get(key) for key in ("name", "namespace", "uid")},
    }
