"""Prometheus metrics of the operator, prefix `cronlock_`, on their own registry."""

from __future__ import annotations

import contextlib
import platform
import typing
from collections.abc import Callable, Iterable, Mapping
from http import HTTPStatus

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    make_wsgi_app,
)
from prometheus_client.core import GaugeMetricFamily

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
CRONJOBS_HELP = (
    "Opted-in CronJobs by namespace and state: guarded (as asked), invalid (latest settings "
    "refused, InvalidConfig), conflict (something it needs is not cronlock's, or another "
    "mutating admission controller takes its injection out: ChangedByAdmission)"
)
CRONJOB_STATES = ("guarded", "invalid", "conflict")
# (namespace, state) -> CronJobs: what the CronJob reconciler knows, counted at each scrape.
CronJobStates = Callable[[], Mapping[tuple[str, str], int]]


class _CronJobStates:
    """cronlock_cronjobs{namespace,state}, counted when scraped (a gauge per namespace set
    on every reconcile would count every guard each time: quadratic at start-up). Every
    namespace with an opted-in CronJob has all three states, so a state that went back to
    0 shows 0 rather than vanishing."""

    def __init__(self) -> None:
        self.source: CronJobStates = dict

    def describe(self) -> Iterable[GaugeMetricFamily]:
        yield GaugeMetricFamily("cronlock_cronjobs", CRONJOBS_HELP, labels=["namespace", "state"])

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "cronlock_cronjobs", CRONJOBS_HELP, labels=["namespace", "state"]
        )
        counts = self.source()
        for namespace in sorted({namespace for namespace, _ in counts}):
            for state in CRONJOB_STATES:
                family.add_metric([namespace, state], counts.get((namespace, state), 0))
        yield family


cronjobs = _CronJobStates()
registry.register(cronjobs)
runs = Counter(
    "cronlock_runs",
    "Runs seen by the operator, by result (acquired, skipped, already_ran, frozen, lost, released)",
    ["result"],
    registry=registry,
)
consecutive_skips = Gauge(
    "cronlock_consecutive_skips",
    "Skipped runs in a row per CronJob (reset by a successful run)",
    ["namespace", "cronjob"],
    registry=registry,
)
max_hold_exceeded = Counter(
    "cronlock_max_hold_exceeded",
    "Runs of a guarded CronJob stopped at its cronlock.io/max-hold (the MaxHoldExceeded Warning)",
    ["namespace", "cronjob"],
    registry=registry,
)
missed_runs = Counter(
    "cronlock_missed_runs",
    "Ticks of a guarded CronJob's schedule that started no run within their deadline",
    ["namespace", "cronjob"],
    registry=registry,
)
ticks = Counter(
    "cronlock_ticks",
    "Ticks of a guarded CronJob by outcome: worked (its run went through the lock and "
    "succeeded or failed, or ran under observe or replace), overlap "
    "(skipped: the lock was held), already_ran (skipped: another run claimed the tick), "
    "frozen (skipped: the lock was frozen), missed (no run started within the deadline); "
    "manual runs are no ticks",
    ["namespace", "cronjob", "outcome"],
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
    "1 while a lock's Lease has a holder (of any of its permits, cronlock.io/permits)",
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
    "Holders cleared by the operator, by lock and reason",
    ["namespace", "lock", "reason"],
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
    "Reconciles that failed and were retried, by namespace and kind",
    ["namespace", "kind"],
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


def count_cronjobs_with(source: CronJobStates) -> None:
    """Where cronlock_cronjobs is counted from at each scrape (the CronJob reconciler)."""
    cronjobs.source = source


# What namespace_seen and lock_seen made series for: every CronJob and Lease event calls
# them (a Lease's on each renewal), and each does the work once.
_namespaces_seen: set[str] = set()
_locks_seen: set[tuple[str, str]] = set()


def namespace_seen(namespace: str) -> None:
    """Its error counters exist from the start at 0, so increase() sees the first error."""
    if namespace in _namespaces_seen:
        return
    _namespaces_seen.add(namespace)
    for kind in RECONCILE_KINDS:
        reconcile_errors.labels(namespace, kind)


def lock_seen(namespace: str, lock: str) -> None:
    """Its takeover counters exist from the start at 0, so increase() sees the first one."""
    if (namespace, lock) in _locks_seen:
        return
    _locks_seen.add((namespace, lock))
    for reason in TAKEOVER_REASONS:
        takeovers.labels(namespace, lock, reason)


def forget_cronjob(namespace: str, name: str) -> None:
    """A deleted CronJob's series go with it (Prometheus would keep showing the last value)."""
    for series in (
        consecutive_skips,
        missed_runs,
        last_success,
        next_run,
        not_succeeding,
        max_hold_exceeded,
    ):
        _remove(series, namespace, name)
    for outcome in TICK_OUTCOMES:
        _remove(ticks, namespace, name, outcome)


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
    max_hold_exceeded.labels(namespace, name)  # and the first run stopped at its max-hold
    for outcome in TICK_OUTCOMES:
        ticks.labels(namespace, name, outcome)


def forget_lock(namespace: str, lock: str) -> None:
    """A deleted Lease's series go with it."""
    _remove(lease_held, namespace, lock)
    _remove(lock_frozen_until, namespace, lock)
    _locks_seen.discard((namespace, lock))
    for reason in TAKEOVER_REASONS:
        _remove(takeovers, namespace, lock, reason)


def set_frozen(namespace: str, lock: str, until: float | None) -> None:
    if until is None:
        _remove(lock_frozen_until, namespace, lock)
    else:
        lock_frozen_until.labels(namespace, lock).set(until)


def _remove(gauge: Gauge | Counter, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # never set
        gauge.remove(*labels)


# Every label value a counter can take exists from the start at 0, so that rate() and
# increase() see the first run, skip, takeover or error after a restart (those with a
# namespace once it is seen: namespace_seen, lock_seen).
RUN_RESULTS = ("acquired", "skipped", "already_ran", "frozen", "lost", "released")
TICK_OUTCOMES = ("worked", "overlap", "already_ran", "frozen", "missed")
TAKEOVER_REASONS = ("expired", "foreign")
RECONCILE_KINDS = tuple(key.kind for key in typing.get_args(Key))
for _result in RUN_RESULTS:
    runs.labels(_result)
for _kind in RECONCILE_KINDS:
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
