"""The kopf wiring: the watches' server-side label selectors are the handlers' filters,
and the due-check loop beats the liveness probe."""

from __future__ import annotations

import asyncio
import contextlib
from http import HTTPStatus
from typing import Any, cast

import kopf
from kopf._cogs.structs.references import Resource  # kopf's own resource record

from cronlock_operator.runtime import handlers, liveness
from cronlock_sidecar import contract


def _handler_labels() -> dict[tuple[str, str], dict[str, object] | None]:
    registry = kopf.get_default_registry()
    return {
        (str(handler.selector.group), str(handler.selector.any_name)): handler.labels
        for handler in registry._watching.get_all_handlers()
    }


def test_every_label_filtered_handler_has_the_same_selector_on_its_watch() -> None:
    filters = _handler_labels()
    filtered = {resource for resource, labels in filters.items() if labels}
    assert filtered == set(handlers.SERVER_SIDE_SELECTORS)
    assert filters[("batch", "jobs")] == {contract.LABEL_LOCK: kopf.PRESENT}
    assert handlers.SERVER_SIDE_SELECTORS[("batch", "jobs")] == contract.LABEL_LOCK
    assert filters[("coordination.k8s.io", "leases")] == {
        contract.LABEL_MANAGED_BY: contract.MANAGED_BY
    }
    assert handlers.SERVER_SIDE_SELECTORS[("coordination.k8s.io", "leases")] == (
        "app.kubernetes.io/managed-by=cronlock"
    )
    # CronJobs opt in by annotation, which no selector can match: that watch stays whole.
    assert filters[("batch", "cronjobs")] is None


def test_the_selectors_reach_the_watch_of_their_resource_only() -> None:
    settings = kopf.OperatorSettings()
    handlers.select_server_side(settings)
    leases = Resource("coordination.k8s.io", "v1", "leases", kind="Lease", namespaced=True)
    jobs = Resource("batch", "v1", "jobs", kind="Job", namespaced=True)
    cronjobs = Resource("batch", "v1", "cronjobs", kind="CronJob", namespaced=True)
    assert settings.watching.label_selectors.collect(leases) == [handlers.LEASE_SELECTOR]
    assert settings.watching.label_selectors.collect(jobs) == [handlers.JOB_SELECTOR]
    assert settings.watching.label_selectors.collect(cronjobs) == []


class Rounds:
    """A reconciler's due checks, failing from round `fail_at` on (0: never)."""

    def __init__(self, fail_at: int = 0) -> None:
        self.rounds = 0
        self.fail_at = fail_at

    def check_expiry(self) -> None:
        self.rounds += 1
        if self.rounds == self.fail_at:
            raise RuntimeError("a bug in the expiry check")

    def check_ticks(self) -> None:
        return None


def test_the_due_check_loop_beats_the_liveness_probe_and_stops_with_its_task() -> None:
    clock = [1000.0]
    alive = liveness.Liveness(lambda: clock[0])

    async def run(checks: Rounds) -> None:
        task = asyncio.create_task(handlers._check_due(cast(Any, checks), alive))
        while checks.rounds < 3 and not task.done():
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, RuntimeError):
            await task

    assert alive.answer("", {})[0] == HTTPStatus.SERVICE_UNAVAILABLE  # starting
    asyncio.run(run(Rounds()))
    assert alive.answer("", {})[0] == HTTPStatus.OK
    # The task ends on an error in round 2: round 1's beat is the last, and it ages.
    clock[0] += 100
    asyncio.run(run(Rounds(fail_at=2)))
    clock[0] += 0.5
    assert alive.answer("", {})[0] == HTTPStatus.OK
    clock[0] += liveness.BEAT_LIMIT_SECONDS
    status, _, body = alive.answer("", {})
    assert status == HTTPStatus.SERVICE_UNAVAILABLE
    assert b'"state": "stalled"' in body
