"""Tick watch: when each guarded CronJob's ticks are due to be judged, and what was seen.

`TickWatch` keeps, per guarded CronJob, the latest tick judged, the scheduled times of the
Jobs seen since (the CronJob controller's annotation), the Warnings last posted, and a
heap of when each CronJob is next due (its next tick plus its deadline). The judging
itself is pure (`reconcile.missed`); the reconciler enqueues what `due` returns and runs
`judge` in a worker. Watch methods run on the event loop thread, `judge` in the workers:
one lock guards the state.
"""

from __future__ import annotations

import datetime
import heapq
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from cronlock_operator.cronjob.reading import Readings, read_config
from cronlock_operator.kube.cache import ObjectCache
from cronlock_operator.objects import Name, annotations_of
from cronlock_operator.reconcile import missed, skips
from cronlock_operator.reconcile.keys import MissedKey
from cronlock_operator.runtime.executor import Executor
from cronlock_operator.runtime.workqueue import DONE, Result
from cronlock_operator.settings import OperatorSettings
from cronlock_sidecar import contract

logger = logging.getLogger(__name__)


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class TickWatch:
    """Judges every guarded CronJob's ticks once each is past its deadline (`Missed`,
    `NotSucceeding`, the run-time metrics), each CronJob when it is due."""

    def __init__(
        self,
        settings: OperatorSettings,
        executor: Executor,
        cronjobs: ObjectCache,
        frozen: Callable[[str, str], bool],
        now: Callable[[], datetime.datetime] = _utcnow,
        *,
        readings: Readings,
    ) -> None:
        self.settings = settings
        self.executor = executor
        self.cronjobs = cronjobs
        self.frozen = frozen  # (namespace, lock) -> whether the lock is frozen now
        self.now = now
        self.readings = readings
        self._lock = threading.Lock()
        self._judged: dict[Name, datetime.datetime] = {}
        self._started: dict[Name, set[datetime.datetime]] = {}
        self._posted: dict[Name, dict[str, str]] = {}
        # What about a CronJob makes its judgment change (schedule, deadline, last success,
        # settings): a change is judged at once, anything else when due.
        self._seen: dict[Name, tuple[Any, ...]] = {}
        self._due_at: dict[Name, float] = {}
        self._heap: list[tuple[float, Name]] = []

    # --- watch events (event loop thread) ------------------------------------------
    def cronjob_seen(self, key: Name, body: Mapping[str, Any]) -> None:
        """A guarded CronJob new or changed in what its judgment reads: due at once."""
        if read_config(body, self.settings, self.readings).config is None:
            self.forget(key)
            return
        spec = body.get("spec") or {}
        status = body.get("status") or {}
        annotations = annotations_of(body)
        fingerprint = (
            spec.get("schedule"),
            spec.get("timeZone"),
            spec.get("suspend"),
            spec.get("startingDeadlineSeconds"),
            status.get("lastSuccessfulTime"),
            annotations.get(contract.ANNOTATION_ALERT_AFTER_MISSED),
        )
        with self._lock:
            if self._seen.get(key) == fingerprint:
                return
            self._seen[key] = fingerprint
            self._schedule(key, 0.0)

    def job_seen(self, job: Mapping[str, Any]) -> None:
        """Remember the tick a CronJob's Job was created for: that tick started a run."""
        owner = skips.owning_cronjob(job)
        tick = missed.scheduled_tick(job)
        if owner is None or tick is None:
            return
        key = (str(job["metadata"]["namespace"]), owner)
        with self._lock:
            judged = self._judged.get(key)
            if judged is None or tick > judged:
                self._started.setdefault(key, set()).add(tick)

    def forget(self, key: Name) -> None:
        with self._lock:
            self._judged.pop(key, None)
            self._started.pop(key, None)
            self._posted.pop(key, None)
            self._seen.pop(key, None)
            self._due_at.pop(key, None)

    def due(self) -> list[Name]:
        """The CronJobs due to be judged now (each once)."""
        now = self.now().timestamp()
        keys: list[Name] = []
        with self._lock:
            while self._heap and self._heap[0][0] <= now:
                when, key = heapq.heappop(self._heap)
                if self._due_at.get(key) == when:
                    del self._due_at[key]
                    keys.append(key)
        return keys

    # --- work (worker threads) ------------------------------------------------------
    def judge(self, cronjob: MissedKey) -> Result:
        """Judge one CronJob's ticks due by now, carry the actions out, plan the next."""
        namespace, name = cronjob.namespace, cronjob.cronjob
        key = (namespace, name)
        body = self.cronjobs.get(key)
        if body is None or read_config(body, self.settings, self.readings).config is None:
            self.forget(key)
            return DONE
        lock = read_config(body, self.settings, self.readings).lock
        now = self.now()
        with self._lock:
            judged = self._judged.get(key)
            started = frozenset(self._started.get(key, ()))
            posted = dict(self._posted.get(key, {}))
        judgment = missed.judge(
            body,
            self.settings,
            now,
            judged_through=judged,
            started=started,
            frozen=self.frozen(namespace, lock),
            posted=posted,
            readings=self.readings,
        )
        if judgment is None:
            logger.warning(
                "%s/%s: schedule %r not understood here; missed runs are not watched",
                namespace,
                name,
                (body.get("spec") or {}).get("schedule"),
            )
            return DONE
        self.executor.run(judgment.actions)
        with self._lock:
            if key not in self._seen:
                return DONE  # forgotten meanwhile (deleted, or no longer guarded)
            self._judged[key] = judgment.judged_through
            kept = {t for t in self._started.get(key, ()) if t > judgment.judged_through}
            self._started[key] = kept
            mine = self._posted.setdefault(key, {})
            for reason, message in judgment.posted.items():
                if message is None:
                    mine.pop(reason, None)
                else:
                    mine[reason] = message
            if judgment.check_at is not None:
                self._schedule(key, judgment.check_at.timestamp())
        return DONE

    def _schedule(self, key: Name, when: float) -> None:
        """Due at `when` (epoch seconds), or sooner if it already is (lock held)."""
        current = self._due_at.get(key)
        if current is not None and current <= when:
            return
        self._due_at[key] = when
        heapq.heappush(self._heap, (when, key))
