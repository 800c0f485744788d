"""Events posted in the background, in order, so a reconcile does not wait for them.

An Event says what happened; nothing the operator decides depends on it. Posting one
took a third of each injection's round trips, so the workers hand Events to one thread
that posts them in the order they were written (a `Skipped` before its `RepeatedSkips`),
retrying a hiccup a few times and logging what it had to give up.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any

from cronlock_operator.kube import Kube
from cronlock_operator.workqueue import Retry

logger = logging.getLogger(__name__)

ATTEMPTS = 4
FIRST_DELAY = 0.5

_Item = tuple[Mapping[str, Any], str, str, bool] | None


class EventPoster:
    """One thread posting Events through `kube`, first in, first out."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._items: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="cronlock-events", daemon=True)
        self._thread.start()

    def post(
        self, involved: Mapping[str, Any], reason: str, message: str, warning: bool = False
    ) -> None:
        # Only what the Event names: a backlog of whole CronJobs was 100 MiB at 10,000.
        self._items.put((_reference(involved), reason, message, warning))

    def stop(self, timeout: float = 5.0) -> None:
        """Post what is waiting (for at most `timeout` seconds), then end the thread."""
        self._items.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while (item := self._items.get()) is not None:
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
