"""tests/support/ledger.py's `settle`, as the clusters ring uses it: the ledger is counted
once every run of the ticks has decided (and worked, if it went ahead), and the test fails
naming those that had not, rather than counting at a fixed time after the last tick."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.contract import GATE_CONTAINER
from tests.support.ledger import settle, undecided

JOBS = {"redis": "every-minute-redis-29942372", "pg": "every-minute-pg-29942372"}


def pod(gate: int | None, main: int | None = None) -> dict[str, Any]:
    def status(name: str, code: int | None) -> dict[str, Any]:
        state = {"running": {}} if code is None else {"terminated": {"exitCode": code}}
        return {"name": name, "state": state}

    return {
        "metadata": {"name": "p"},
        "status": {
            "initContainerStatuses": [status(GATE_CONTAINER, gate)],
            "containerStatuses": [status("main", main)],
        },
    }


def pods_of(pods: dict[str, list[dict[str, Any]]]) -> Any:
    return lambda job: pods.get(job, [])


def test_a_run_is_undecided_until_its_gate_ended_and_a_run_that_went_ahead_worked() -> None:
    job = JOBS["redis"]
    cases = [
        ({}, [f"{job}: no pod yet"]),
        ({job: [pod(None)]}, [f"{job}: gate running"]),
        ({job: [pod(0)]}, [f"{job}: working"]),
        ({job: [pod(0, 0)]}, []),
        ({job: [pod(75)]}, []),  # skipped: nothing to work
        ({job: [pod(75), pod(None)]}, [f"{job}: gate running"]),  # the latest pod counts
    ]
    for pods, expected in cases:
        assert undecided(pods_of(pods), [job]) == expected, pods


def test_settle_fails_naming_the_runs_still_undecided() -> None:
    pods = {job: [pod(75)] for job in JOBS.values()}
    settle(pods_of(pods), list(JOBS.values()), timeout=0)
    pods[JOBS["pg"]] = [pod(0)]
    with pytest.raises(AssertionError, match=f"{JOBS['pg']}: working"):
        settle(pods_of(pods), list(JOBS.values()), timeout=0.5)
