"""The work queue: each key waits once, is never worked on twice at once, failures back off,
and a reconcile's Result asks for a look again later."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from cronlock_operator.kube.errors import Rejected, Retry
from cronlock_operator.runtime.workqueue import DONE, Result, WorkQueue


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), timeout=10))


async def until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.005)


def test_a_key_added_many_times_while_waiting_is_worked_on_once() -> None:
    done: list[str] = []

    async def work(key: str) -> Result:
        done.append(key)
        return DONE

    async def scenario() -> None:
        queue: WorkQueue[str] = WorkQueue(work, workers=2)
        for _ in range(5):
            queue.add("a")
        queue.add("b")
        queue.start()
        await until(queue.idle)
        await queue.stop()
        assert sorted(done) == ["a", "b"]

    run(scenario)


def test_a_key_is_never_worked_on_by_two_workers_and_a_change_meanwhile_runs_it_again() -> None:
    running: set[str] = set()
    overlaps: list[str] = []
    runs: list[str] = []
    release = asyncio.Event()

    async def work(key: str) -> Result:
        if key in running:
            overlaps.append(key)
        running.add(key)
        runs.append(key)
        if len(runs) == 1:
            await release.wait()
        running.discard(key)
        return DONE

    async def scenario() -> None:
        queue: WorkQueue[str] = WorkQueue(work, workers=4)
        queue.start()
        queue.add("a")
        await until(lambda: runs == ["a"])
        queue.add("a")  # arrives while "a" is being worked on
        queue.add("a")
        await asyncio.sleep(0.05)
        assert runs == ["a"], "a second worker took the key"
        release.set()
        await until(lambda: len(runs) == 2 and queue.idle())
        await queue.stop()
        assert overlaps == []
        assert runs == ["a", "a"]  # once more for the change, not once per add

    run(scenario)


@pytest.mark.parametrize("failure", [Retry("conflict"), RuntimeError("bug")])
def test_a_failed_key_comes_back_after_a_backoff(failure: Exception) -> None:
    attempts: list[float] = []

    async def work(key: str) -> Result:
        attempts.append(asyncio.get_running_loop().time())
        if len(attempts) < 3:
            raise failure
        return DONE

    async def scenario() -> None:
        queue: WorkQueue[str] = WorkQueue(work, workers=1, base_delay=0.05, max_delay=1.0)
        queue.start()
        queue.add("a")
        await until(lambda: len(attempts) == 3 and queue.idle())
        await queue.stop()
        first, second = attempts[1] - attempts[0], attempts[2] - attempts[1]
        assert first >= 0.045
        assert second >= 0.095  # doubled

    run(scenario)


def test_a_rejected_key_is_never_retried_until_it_is_added_again() -> None:
    attempts: list[str] = []

    async def work(key: str) -> Result:
        attempts.append(key)
        raise Rejected("the API server refused it for good")

    async def scenario() -> None:
        queue: WorkQueue[str] = WorkQueue(work, workers=1, base_delay=0.01)
        queue.start()
        queue.add("a")
        await until(lambda: attempts == ["a"] and queue.idle())
        await asyncio.sleep(0.1)  # ten base delays: no backoff timer was set
        assert attempts == ["a"]
        queue.add("a")  # its next change is looked at anew
        await until(lambda: attempts == ["a", "a"] and queue.idle())
        await queue.stop()

    run(scenario)


def test_a_result_can_ask_for_a_look_again_after_its_own_delay() -> None:
    attempts: list[float] = []

    async def work(key: str) -> Result:
        attempts.append(asyncio.get_running_loop().time())
        return Result(requeue_after=0.2) if len(attempts) == 1 else DONE

    async def scenario() -> None:
        queue: WorkQueue[str] = WorkQueue(work, workers=1, base_delay=0.01)
        queue.start()
        queue.add("a")
        await until(lambda: len(attempts) == 2)
        await asyncio.sleep(0.3)
        await queue.stop()
        assert attempts[1] - attempts[0] >= 0.19
        assert len(attempts) == 2, "done the second time: no look again"

    run(scenario)


def test_stop_cancels_pending_retries() -> None:
    attempts: list[str] = []

    async def work(key: str) -> Result:
        attempts.append(key)
        return Result(requeue_after=0.2)

    async def scenario() -> None:
        queue: WorkQueue[str] = WorkQueue(work, workers=1)
        queue.start()
        queue.add("a")
        await until(lambda: attempts == ["a"])
        await queue.stop()
        await asyncio.sleep(0.3)
        assert attempts == ["a"]

    run(scenario)
