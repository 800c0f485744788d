"""CronJob and Lease dicts shaped like the API server's JSON, for the status tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tests.support.cronjobs import make_cronjob

NOW = datetime(2026, 11, 29, 8, 0, 0, tzinfo=UTC)


def stamp(seconds_before_now: float) -> str:
    """A MicroTime string `seconds_before_now` seconds before NOW."""
    moment = NOW - timedelta(seconds=seconds_before_now)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def cronjob(
    name: str,
    namespace: str = "default",
    *,
    enabled: str | None = "true",
    lock: str | None = None,
    skips: int | None = None,
    alert_after: str | None = None,
    last_schedule_ago: float | None = None,
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
    cronjob = make_cronjob(
        name=name,
        namespace=namespace,
        annotations=annotations,
        restart_policy="Never",
        containers=[{"name": "main", "image": "busybox"}],
    )
    cronjob["status"] = status
    return cronjob


def lease(
    lock: str,
    namespace: str = "default",
    *,
    holder: str | None = None,
    renewed_ago: float | None = None,
    duration: int = 30,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"leaseDurationSeconds": duration}
    if holder is not None:
        spec["holderIdentity"] = holder
    if renewed_ago is not None:
        spec["renewTime"] = stamp(renewed_ago)
        spec["acquireTime"] = stamp(renewed_ago + 100)
    return {
        "metadata": {
            "name": f"cronlock-{lock}",
            "namespace": namespace,
            "annotations": annotations or {},
        },
        "spec": spec,
    }
