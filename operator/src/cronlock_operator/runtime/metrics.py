"""Prometheus metrics of the operator, prefix `cronlock_`, on their own registry."""

from __future__ import annotations

import contextlib
import platform
import typing
from collections.abc import Iterable, Mapping
from http import HTTPStatus

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    make_wsgi_app,
)

from cronlock_operator.kube.client import version
from cronlock_operator.reconcile.keys import Key
from cronlock_operator.runtime.httpserver import Answer, BoundedServer

# `*_created` series double the counters' series and no alert reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]
registry = CollectorRegistry(auto_describe=True)

guarded_cronjobs = Gauge(
    "cronlock_guarded_cronjobs",
    "CronJobs whose runs cronlock guards with a Lease",
    registry=registry,
)
cronjobs = Gauge(
    "cronlock_cronjobs",
    "Opted-in CronJobs by state: guarded (as asked), invalid (latest settings refused, "
    "InvalidConfig), conflict (something it needs is not cronlock's, or another mutating "
    "admission controller takes its injection out: ChangedByAdmission)",
    ["state"],
    registry=registry,
)
CRONJOB_STATES = ("guarded", "invalid", "conflict")
runs = Counter(
    "cronlock_runs",
    "Runs seen by the operator, by result (acquired, skipped, frozen, lost, released)",
    ["result"],
    registry=registry,
)
consecutive_skips = Gauge(
    "cronlock_consecutive_skips",
    "Skipped runs in a row per CronJob (reset by a successful run)",
    ["namespace", "cronjob"],
    registry=registry,
)
missed_runs = Counter(
    "cronlock_missed_runs",
    "Ticks of a guarded CronJob's schedule that started no run within their deadline",
    ["namespace", "cronjob"],
    registry=registry,
)
last_success = Gauge(
    "cronlock_last_success_timestamp_seconds",
    "When a guarded CronJob's last successful run finished (status.lastSuccessfulTime); "
    "no series before its first success",
    ["namespace", "cronjob"],
    registry=registry,
)
next_run = Gauge(
    "cronlock_next_run_timestamp_seconds",
    "A guarded CronJob's next tick by its schedule",
    ["namespace", "cronjob"],
    registry=registry,
)
not_succeeding = Gauge(
    "cronlock_not_succeeding",
    "1 while a guarded CronJob had cronlock.io/alert-after-missed ticks without a "
    "successful run (the NotSucceeding Warning), else 0",
    ["namespace", "cronjob"],
    registry=registry,
)
lease_held = Gauge(
    "cronlock_lease_held",
    "1 while a lock's Lease has a holder",
    ["namespace", "lock"],
    registry=registry,
)
lock_frozen_until = Gauge(
    "cronlock_lock_frozen_until_timestamp_seconds",
    "When a frozen lock's freeze ends (cronlock freeze); no series for a lock not frozen",
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
leader = Gauge(
    "cronlock_leader",
    "1 while this replica leads (always, without leader election), 0 while it waits to lead",
    registry=registry,
)
build_info = Gauge(
    "cronlock_build_info",
    "Always 1; the labels say which operator version runs, on which Python",
    ["version", "python"],
    registry=registry,
)


build_info.labels(version(), platform.python_version()).set(1)


def set_cronjob_states(*, guarded: int, invalid: int, conflict: int) -> None:
    for state, count in zip(CRONJOB_STATES, (guarded, invalid, conflict), strict=True):
        cronjobs.labels(state).set(count)


def forget_cronjob(namespace: str, name: str) -> None:
    """A deleted CronJob's series go with it (Prometheus would keep showing the last value)."""
    for series in (consecutive_skips, missed_runs, last_success, next_run, not_succeeding):
        _remove(series, namespace, name)


def set_run_times(
    namespace: str,
    name: str,
    next_tick: float | None,
    succeeded: float | None,
    failing: bool,
) -> None:
    for gauge, value in ((next_run, next_tick), (last_success, succeeded)):
        if value is None:
            _remove(gauge, namespace, name)
        else:
            gauge.labels(namespace, name).set(value)
    not_succeeding.labels(namespace, name).set(1 if failing else 0)
    missed_runs.labels(namespace, name)  # 0 from the start: increase() sees the first miss


def forget_lock(namespace: str, lock: str) -> None:
    """A deleted Lease's series go with it."""
    _remove(lease_held, namespace, lock)
    _remove(lock_frozen_until, namespace, lock)


def set_frozen(namespace: str, lock: str, until: float | None) -> None:
    if until is None:
        _remove(lock_frozen_until, namespace, lock)
    else:
        lock_frozen_until.labels(namespace, lock).set(until)


def _remove(gauge: Gauge | Counter, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # never set
        gauge.remove(*labels)


# Every label value a counter can take exists from the start at 0, so that rate() and
# increase() see the first run, skip, takeover or error after a restart.
RUN_RESULTS = ("acquired", "skipped", "frozen", "lost", "released")
TAKEOVER_REASONS = ("expired",)
RECONCILE_KINDS = tuple(key.kind for key in typing.get_args(Key))
set_cronjob_states(guarded=0, invalid=0, conflict=0)
for _result in RUN_RESULTS:
    runs.labels(_result)
for _reason in TAKEOVER_REASONS:
    takeovers.labels(_reason)
for _kind in RECONCILE_KINDS:
    reconcile_errors.labels(_kind)
    reconcile_duration.labels(_kind)


# Any pod in the cluster can reach /metrics, so what its clients can hold is bounded: each
# connection is a thread and a buffer, and the operator has 256 Mi.
CONNECTIONS = 32  # served at once, all clients together (then a busier peer's oldest goes)
CONNECTIONS_PER_CLIENT = 4  # per address, so one pod cannot take them all from Prometheus
TIMEOUT = 5.0  # seconds from accept to close, for the request and the answer together
PATH = "/metrics"

# prometheus_client's own answer (the format the scraper asks for, gzip if it may), here
# behind a server that bounds its clients.
_exposition = make_wsgi_app(registry)


def _metrics(query: str, fields: Mapping[str, str]) -> Answer:
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": PATH,
        "QUERY_STRING": query,
        "HTTP_ACCEPT": fields.get("accept", ""),
        "HTTP_ACCEPT_ENCODING": fields.get("accept-encoding", ""),
    }
    headers: dict[str, str] = {}

    def start_response(status: str, answered: Iterable[tuple[str, str]]) -> None:
        headers.update(answered)

    body = b"".join(typing.cast(Iterable[bytes], _exposition(environ, start_response)))
    return HTTPStatus.OK, headers, body


def serve(port: int, address: str = "0.0.0.0") -> BoundedServer:
    """Serve /metrics on `address` (all interfaces by default: a Service scrapes it)."""
    server = BoundedServer(
        address,
        port,
        {PATH: _metrics},
        timeout=TIMEOUT,
        connections=CONNECTIONS,
        per_client=CONNECTIONS_PER_CLIENT,
        name="cronlock-metrics",
    )
    server.start()
    return server
