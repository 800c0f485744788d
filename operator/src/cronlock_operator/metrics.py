"""Prometheus metrics of the operator, prefix `cronlock_`, on their own registry."""

from __future__ import annotations

import contextlib
import platform
import typing
from importlib import metadata

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)

from cronlock_operator.keys import Key

# `*_created` series double the counters' series and no alert reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]
registry = CollectorRegistry(auto_describe=True)

guarded_cronjobs = Gauge(
    "cronlock_guarded_cronjobs",
    "CronJobs whose runs cronlock guards with a Lease",
    registry=registry,
)
runs = Counter(
    "cronlock_runs",
    "Runs seen by the operator, by result (acquired, skipped, lost, released)",
    ["result"],
    registry=registry,
)
consecutive_skips = Gauge(
    "cronlock_consecutive_skips",
    "Skipped runs in a row per CronJob (reset by a successful run)",
    ["namespace", "cronjob"],
    registry=registry,
)
lease_held = Gauge(
    "cronlock_lease_held",
    "1 while a lock's Lease has a holder",
    ["namespace", "lock"],
    registry=registry,
)
takeovers = Counter(
    "cronlock_takeovers",
    "Holders cleared by the operator, by reason",
    ["reason"],
    registry=registry,
)
overlaps = Counter(
    "cronlock_overlaps",
    "Runs under the observe policy that ran while another run held their lock",
    registry=registry,
)
replacements = Counter(
    "cronlock_replacements",
    "Runs stopped under the replace policy because a newer run took their lock over",
    registry=registry,
)
reconcile_errors = Counter(
    "cronlock_reconcile_errors",
    "Reconciles that failed and were retried, by kind",
    ["kind"],
    registry=registry,
)

reconcile_duration = Histogram(
    "cronlock_reconcile_duration_seconds",
    "How long one reconcile took, by kind (a retried one counts once per try)",
    ["kind"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=registry,
)
build_info = Gauge(
    "cronlock_build_info",
    "Always 1; the labels say which operator version runs, on which Python",
    ["version", "python"],
    registry=registry,
)


def _version() -> str:
    try:
        return metadata.version("cronlock")
    except metadata.PackageNotFoundError:
        return "unknown"


build_info.labels(_version(), platform.python_version()).set(1)


def forget_cronjob(namespace: str, name: str) -> None:
    """A deleted CronJob's series go with it (Prometheus would keep showing the last value)."""
    _remove(consecutive_skips, namespace, name)


def forget_lock(namespace: str, lock: str) -> None:
    """A deleted Lease's series go with it."""
    _remove(lease_held, namespace, lock)


def _remove(gauge: Gauge, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # never set
        gauge.remove(*labels)


# Every label value a counter can take exists from the start at 0, so that rate() and
# increase() see the first run, skip, takeover or error after a restart.
RUN_RESULTS = ("acquired", "skipped", "lost", "released")
TAKEOVER_REASONS = ("expired",)
RECONCILE_KINDS = tuple(key.kind for key in typing.get_args(Key))
for _result in RUN_RESULTS:
    runs.labels(_result)
for _reason in TAKEOVER_REASONS:
    takeovers.labels(_reason)
for _kind in RECONCILE_KINDS:
    reconcile_errors.labels(_kind)
    reconcile_duration.labels(_kind)


def serve(port: int, address: str = "0.0.0.0") -> None:
    """Serve /metrics on `address` (all interfaces by default: a Service scrapes it)."""
    start_http_server(port, addr=address, registry=registry)
