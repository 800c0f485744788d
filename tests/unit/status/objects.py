"""CronJob and Lease dicts shaped like the API server's JSON, for the status tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tests.support import gen
from tests.support.leases import make_lease

NOW = datetime(2026, 11, 29, 8, 0, 0, tzinfo=UTC)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def stamp(seconds_before_now: float) -> str:
    """A MicroTime string `seconds_before_now` seconds before NOW."""
    return ago(seconds_before_now).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def cronjob(
    name: str,
    namespace: str = "default",
    *,
    enabled: str | None = "true",
    lock: str | None = None,
    skips: int | None = None,
    alert_after: str | None = None,
    last_schedule_ago: float | None = None,
    service_account: str | None = None,
) -> dict[str, Any]:
    annotations = {}
    if enabled is not None:
        annotations["cronlock.io/enabled"] = enabled
    if lock is not None:
        annotations["cronlock.io/lock"] = lock
    if skips is not None:
        annotations["cronlock.io/consecutive-skips"] = str(skips)
    if alert_after is not None:
        annotations["cronlock.io/alert-after"] = alert_after
    status = {}
    if last_schedule_ago is not None:
        status["lastScheduleTime"] = stamp(last_schedule_ago).split(".")[0] + "Z"
    return gen.cronjob(
        name,
        gen.in_namespace(namespace),
        gen.with_annotations(annotations),
        gen.restart_policy("Never"),
        gen.containers({"name": "main", "image": "busybox"}),
        *([] if service_account is None else [gen.service_account(service_account)]),
        gen.with_status(status),
    )


def lease(
    lock: str,
    namespace: str = "default",
    *,
    holder: str = "",
    renewed_ago: float | None = None,
    duration: int = 30,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The Lease of `lock` (tests.support.leases), its times counted back from NOW: claimed
    100 s before it was last renewed, `renewed_ago` seconds ago; without a holder, the
    times of an earlier hold."""
    return make_lease(
        holder,
        lock=lock,
        namespace=namespace,
        acquired=None if renewed_ago is None else ago(renewed_ago + 100),
        renewed=None if renewed_ago is None else ago(renewed_ago),
        duration=duration,
        annotations=annotations,
    )
