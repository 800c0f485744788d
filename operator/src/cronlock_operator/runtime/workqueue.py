"""A deduplicating work queue with per-key backoff: kopf's event handlers are not retried.

kopf tracks and retries only its change-detecting handlers, and those keep bookkeeping
annotations on the objects they handle, which cronlock must not leave on users'
CronJobs. So the event handlers only enqueue keys and this queue does the rest, like
controller-runtime's: a key waits at most once in the queue, is never worked on by two
workers at once, and a failed key comes back after an exponential backoff. A reconcile
returns a `Result`: done, or look again after a while (not an error); it raises `Retry`
to try again with backoff (an error, said why), as controller-runtime's reconcilers
return an error, and `Rejected` to stop for good (never retried). One channel each: nothing
in a `Result` asks for backoff.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from cronlock_operator.kube.errors import Rejected, Retry

Key = TypeVar("Key", bound=Hashable)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Result:
    """What a reconcile asks of the queue, as controller-runtime's `reconcile.Result`:
    nothing (done), or `requeue_after` seconds until it looks again (someone may fix what
    it found meanwhile; not an error). Backoff is asked by raising `Retry`."""

    requeue_after: float | None = None


DONE = Result()


@dataclass
class WorkQueue(Generic[Key]):
    """Keys to reconcile, each handled by `work` in one of `workers` tasks."""

    work: Callable[[Key], Awaitable[Result]]
    workers: int = 4
    base_delay: float = 0.5
    max_delay: float = 60.0
    _queue: asyncio.Queue[Key] = field(default_factory=asyncio.Queue)
    _queued: set[Key] = field(default_factory=set)
    _active: set[Key] = field(default_factory=set)
    _dirty: set[Key] = field(default_factory=set)
    _failures: dict[Key, int] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _timers: set[asyncio.TimerHandle] = field(default_factory=set)

    def add(self, key: Key) -> None:
        """Ask for `key` to be reconciled; a no-op if it is already waiting."""
        if key in self._active:
            self._dirty.add(key)  # picked up again when the current run ends
            return
        if key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def add_after(self, key: Key, delay: float) -> None:
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None

        def fire() -> None:
            if timer is not None:
                self._timers.discard(timer)
            self.add(key)

        timer = loop.call_later(delay, fire)
        self._timers.add(timer)

    def start(self) -> None:
        for number in range(self.workers):
            self._tasks.append(asyncio.create_task(self._run(), name=f"cronlock-worker-{number}"))

    async def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def waiting(self, key: Key) -> bool:
        """Whether `key` is queued (or due again after its current run)."""
        return key in self._queued or key in self._dirty

    def idle(self) -> bool:
        """Nothing queued, running or waiting for a retry."""
        return not (self._queued or self._active or self._timers)

    async def _run(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._active.add(key)
            try:
                result = await self.work(key)
            except Retry as retry:
                self._backoff(key, str(retry))
            except Rejected as rejected:
                # Terminal, as controller-runtime's TerminalError: told, never retried (the
                # reconciler tells its object; this is the queue's own last word on it).
                self._failures.pop(key, None)
                logger.warning("reconcile of %s refused for good: %s", key, rejected)
            except Exception:
                logger.exception("reconcile of %s failed; retrying with backoff", key)
                self._backoff(key, "unexpected error")
            else:
                self._failures.pop(key, None)
                if result.requeue_after is not None:
                    logger.debug("%s again in %.1fs", key, result.requeue_after)
                    self.add_after(key, result.requeue_after)
            finally:
                self._active.discard(key)
                if key in self._dirty:
                    self._dirty.discard(key)
                    self.add(key)

    def _backoff(self, key: Key, reason: str) -> None:
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        wait = min(self.max_delay, self.base_delay * 2 ** (failures - 1))
        logger.info("retrying %s in %.1fs: %s", key, wait, reason)
        self.add_after(key, wait)
