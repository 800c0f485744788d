"""`cronlock status`: who holds the Lease of each guarded CronJob, for people and scripts."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Literal

import kubernetes
import urllib3

from cronlock_sidecar import contract
from cronlock_sidecar.lockmodel import is_expired, read_lease
from cronlock_sidecar.microtime import MicroTimeError, parse_microtime

LeaseState = Literal["held", "free", "expired", "missing"]
Output = Literal["table", "json", "wide"]

EXIT_OK: Final = 0
EXIT_ATTENTION: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNAVAILABLE: Final = contract.EXIT_UNAVAILABLE

WATCH_INTERVAL_SECONDS: Final = 2.0
# Piped output has no terminal to fit; kubectl does not truncate it either.
_UNBOUNDED_WIDTH: Final = 10_000
_GAP: Final = "   "
_NONE: Final = "-"
_ELLIPSIS: Final = "…"
_HOLDER_MIN_WIDTH: Final = 16
_LAST_RESORT_MIN_WIDTH: Final = 6
_REQUEST_TIMEOUT: Final = (5, 30)
_SERVICE_ACCOUNT_NAMESPACE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class StatusRow:
    """One guarded CronJob and the state of its lock at `now`."""

    namespace: str
    cronjob: str
    lock: str
    lease: str
    state: LeaseState
    holder: str | None
    renewed_at: datetime | None
    expires_at: datetime | None
    lease_duration_seconds: int | None
    consecutive_skips: int
    alert_after: int
    last_schedule: datetime | None
    last_holder: str | None
    released_at: datetime | None
    suspended: bool
    now: datetime
    problems: tuple[str, ...]

    @property
    def renewed_seconds_ago(self) -> float | None:
        return _seconds_between(self.renewed_at, self.now)

    @property
    def expires_in_seconds(self) -> float | None:
        """Negative once expired; None when nobody holds the lock."""
        if self.state not in ("held", "expired"):
            return None
        return _seconds_between(self.now, self.expires_at)

    @property
    def last_schedule_seconds_ago(self) -> float | None:
        return _seconds_between(self.last_schedule, self.now)


# --- the pure part ------------------------------------------------------------------


def rows(
    cronjobs: list[dict[str, Any]],
    leases: list[dict[str, Any]],
    now: datetime,
    *,
    skew_seconds: float = contract.DEFAULT_SKEW_SECONDS,
) -> list[StatusRow]:
    """A row per guarded CronJob (annotated enabled=true), sorted by namespace and name."""
    by_name = {
        (_metadata(lease).get("namespace", ""), _metadata(lease).get("name", "")): lease
        for lease in leases
    }
    guarded = [
        cronjob
        for cronjob in cronjobs
        if _annotations(cronjob).get(contract.ANNOTATION_ENABLED) == "true"
    ]
    result = [_row(cronjob, by_name, now, skew_seconds) for cronjob in guarded]
    return sorted(result, key=lambda row: (row.namespace, row.cronjob))


def _row(
    cronjob: Mapping[str, Any],
    leases: Mapping[tuple[str, str], Mapping[str, Any]],
    now: datetime,
    skew_seconds: float,
) -> StatusRow:
    metadata = _metadata(cronjob)
    namespace = str(metadata.get("namespace", ""))
    name = str(metadata.get("name", ""))
    annotations = _annotations(cronjob)
    lock = annotations.get(contract.ANNOTATION_LOCK) or name
    lease_name = contract.lease_name(lock)
    lease = leases.get((namespace, lease_name))
    record = read_lease(lease or {})
    holder = record.holder or None
    expires_at = record.expires_at
    state: LeaseState
    if lease is None:
        state = "missing"
    elif holder is None:
        state = "free"
    elif is_expired(record, now, skew_seconds):
        # The same rule the sidecar uses to take a lock over: expired beyond the clock skew.
        state = "expired"
    else:
        state = "held"
    skips = _whole_number(annotations.get(contract.ANNOTATION_CONSECUTIVE_SKIPS), 0)
    alert_after = _whole_number(
        annotations.get(contract.ANNOTATION_ALERT_AFTER), contract.DEFAULT_ALERT_AFTER, minimum=1
    )
    status: Mapping[str, Any] = cronjob.get("status") or {}
    problems = []
    if state == "expired":
        ago = f"{human_duration(now - expires_at)} ago" if expires_at is not None else "long ago"
        problems.append(
            f"lease {namespace}/{lease_name} expired {ago} but is still held by {holder}"
        )
    if skips >= alert_after:
        problems.append(
            f"cronjob {namespace}/{name} skipped {skips} consecutive runs "
            f"(alert-after {alert_after})"
        )
    return StatusRow(
        namespace=namespace,
        cronjob=name,
        lock=lock,
        lease=lease_name,
        state=state,
        holder=holder,
        renewed_at=record.renewed_at,
        expires_at=expires_at,
        lease_duration_seconds=record.duration_seconds,
        consecutive_skips=skips,
        alert_after=alert_after,
        last_schedule=_time(status.get("lastScheduleTime")),
        last_holder=record.last_holder or None,
        released_at=record.released_at,
        suspended=bool((cronjob.get("spec") or {}).get("suspend")),
        now=now,
        problems=tuple(problems),
    )


def exit_code(status_rows: Iterable[StatusRow]) -> int:
    """1 when any lock is expired but still held or any CronJob reached its alert-after."""
    return EXIT_ATTENTION if any(row.problems for row in status_rows) else EXIT_OK


def human_duration(delta: timedelta | float) -> str:
    """kubectl's short ages: 45s, 3m12s, 47m, 5h3m, 2d4h, 400d."""
    seconds = round(delta.total_seconds() if isinstance(delta, timedelta) else delta)
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        rest = seconds % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if days < 8:
        rest = hours % 24
        return f"{days}d{rest}h" if rest else f"{days}d"
    if days < 730:
        return f"{days}d"
    years, rest = divmod(days, 365)
    return f"{years}y{rest}d" if rest and years < 8 else f"{years}y"


def renewed_text(row: StatusRow) -> str:
    seconds = row.renewed_seconds_ago
    if seconds is None or row.state == "missing":
        return _NONE
    return f"{human_duration(seconds)} ago"


def expires_text(row: StatusRow) -> str:
    seconds = row.expires_in_seconds
    if seconds is None:
        return _NONE
    if seconds >= 0:
        return f"in {human_duration(seconds)}"
    return f"expired {human_duration(-seconds)} ago"


def holder_text(row: StatusRow) -> str:
    if row.state == "missing":
        return "missing"
    return row.holder or _NONE


def _ago(moment: datetime | None, now: datetime) -> str:
    seconds = _seconds_between(moment, now)
    return _NONE if seconds is None else f"{human_duration(seconds)} ago"


@dataclass(frozen=True)
class _Column:
    header: str
    cell: Callable[[StatusRow], str]
    # Order in which columns go when the terminal is too narrow; None = never dropped.
    drop_rank: int | None = None
    truncatable: bool = False


_NAMESPACE = _Column("NAMESPACE", lambda row: row.namespace, truncatable=True)
_COLUMNS: Final = (
    _Column("CRONJOB", lambda row: row.cronjob, truncatable=True),
    _Column("LOCK", lambda row: row.lock, drop_rank=3),
    _Column("HOLDER", holder_text, truncatable=True),
    _Column("RENEWED", renewed_text, drop_rank=2),
    _Column("EXPIRES", expires_text),
    _Column("SKIPS", lambda row: str(row.consecutive_skips), drop_rank=4),
    _Column("LAST SCHEDULE", lambda row: _ago(row.last_schedule, row.now), drop_rank=1),
)
_WIDE_COLUMNS: Final = (
    *_COLUMNS,
    _Column("STATE", lambda row: row.state),
    _Column(
        "TTL",
        lambda row: (
            _NONE if row.lease_duration_seconds is None else f"{row.lease_duration_seconds}s"
        ),
    ),
    _Column("ALERT AFTER", lambda row: str(row.alert_after)),
    _Column("SUSPEND", lambda row: str(row.suspended).lower()),
    _Column("LAST HOLDER", lambda row: row.last_holder or _NONE),
    _Column("RELEASED", lambda row: _ago(row.released_at, row.now)),
)


def render_table(
    status_rows: Sequence[StatusRow],
    width: int,
    *,
    all_namespaces: bool = False,
    wide: bool = False,
) -> str:
    """Aligned columns that fit `width`: HOLDER is truncated with … first, then columns go."""
    columns = list(_WIDE_COLUMNS if wide else _COLUMNS)
    if all_namespaces:
        columns.insert(0, _NAMESPACE)
    if all(row.lock == row.cronjob for row in status_rows):
        # Every lock is the default one, the CronJob's name: LOCK says nothing new.
        columns = [
            replace(column, drop_rank=0) if column.header == "LOCK" else column
            for column in columns
        ]
    cells = [[column.cell(row) for column in columns] for row in status_rows]
    natural = [
        max([len(column.header), *(len(line[index]) for line in cells)])
        for index, column in enumerate(columns)
    ]
    if wide:
        visible, widths = list(range(len(columns))), natural
    else:
        visible, widths = _fit(columns, natural, width)
    lines = [[column.header for column in columns], *cells]
    return "\n".join(
        _GAP.join(
            _truncate(line[index], widths[index]).ljust(widths[index]) for index in visible
        ).rstrip()
        for line in lines
    )


def _fit(
    columns: Sequence[_Column], natural: Sequence[int], width: int
) -> tuple[list[int], list[int]]:
    """Which columns to show and how wide, so that a line is at most `width` when possible."""
    headers = [column.header for column in columns]
    holder = headers.index("HOLDER")
    visible = list(range(len(columns)))
    droppable = sorted(
        (index for index, column in enumerate(columns) if column.drop_rank is not None),
        key=lambda index: columns[index].drop_rank or 0,
    )

    def total(widths: Sequence[int]) -> int:
        return sum(widths[index] for index in visible) + len(_GAP) * (len(visible) - 1)

    while True:
        widths = list(natural)
        excess = total(widths) - width
        if excess <= 0:
            return visible, widths
        if natural[holder] - excess >= min(_HOLDER_MIN_WIDTH, natural[holder]):
            widths[holder] = natural[holder] - excess
            return visible, widths
        if not droppable:
            break
        visible.remove(droppable.pop(0))
    # Still too wide with only the essential columns: shave the widest name-like column.
    widths[holder] = min(natural[holder], _HOLDER_MIN_WIDTH)
    shrinkable = [index for index in visible if columns[index].truncatable]
    while total(widths) > width:
        index = max(shrinkable, key=lambda candidate: widths[candidate])
        floor = max(_LAST_RESORT_MIN_WIDTH, len(headers[index]))
        if widths[index] <= floor:
            break
        widths[index] -= 1
    return visible, widths


def _truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + _ELLIPSIS


def render_json(status_rows: Sequence[StatusRow]) -> str:
    """A JSON list with the table's fields: ISO timestamps, seconds as numbers, null for none."""
    return json.dumps([_json_row(row) for row in status_rows], indent=2)


def _json_row(row: StatusRow) -> dict[str, Any]:
    return {
        "namespace": row.namespace,
        "cronjob": row.cronjob,
        "lock": row.lock,
        "lease": row.lease,
        "state": row.state,
        "holder": row.holder,
        "renewTime": _iso(row.renewed_at),
        "renewedSecondsAgo": _number(row.renewed_seconds_ago),
        "expireTime": _iso(row.expires_at) if row.state in ("held", "expired") else None,
        "expiresInSeconds": _number(row.expires_in_seconds),
        "leaseDurationSeconds": row.lease_duration_seconds,
        "consecutiveSkips": row.consecutive_skips,
        "alertAfter": row.alert_after,
        "lastScheduleTime": _iso(row.last_schedule),
        "lastScheduleSecondsAgo": _number(row.last_schedule_seconds_ago),
        "lastHolder": row.last_holder,
        "releasedAt": _iso(row.released_at),
        "suspend": row.suspended,
        "problems": list(row.problems),
    }


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _number(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def _seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return (end - start).total_seconds()


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata: Mapping[str, Any] = obj.get("metadata") or {}
    return metadata


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    annotations: Mapping[str, str] = _metadata(obj).get("annotations") or {}
    return annotations


def _time(value: object) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_microtime(value)
    except MicroTimeError:
        return None


def _whole_number(value: str | None, default: int, *, minimum: int = 0) -> int:
    """A counter or threshold from an annotation; the operator reports bad values itself."""
    if value is None or not value.strip().isdigit():
        return default
    number = int(value)
    return number if number >= minimum else default


# --- the API edge ---------------------------------------------------------------------


class Unavailable(Exception):
    """The API server could not be reached, or refused a request; the message says which."""


class UsageError(Exception):
    """A flag names something that does not exist (a kubeconfig file, a context)."""


@dataclass(frozen=True)
class Cluster:
    api: Any  # kubernetes.client.ApiClient
    namespace: str
    server: str


def connect(kubeconfig: str | None, context: str | None) -> Cluster:
    """An ApiClient from KUBECONFIG (like kubectl) or, failing that, the pod's ServiceAccount."""
    configuration = kubernetes.client.Configuration()
    if kubeconfig is not None and not Path(kubeconfig).expanduser().is_file():
        raise UsageError(f"--kubeconfig {kubeconfig}: no such file")
    try:
        kubernetes.config.load_kube_config(
            config_file=kubeconfig,
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
        contexts, active = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig)
        chosen = next((entry for entry in contexts if entry["name"] == context), active)
        namespace = (chosen.get("context") or {}).get("namespace") or "default"
    except kubernetes.config.ConfigException as error:
        if kubeconfig is not None or context is not None:
            raise UsageError(f"kubeconfig: {error}") from error
        if not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise Unavailable(
                f"no Kubernetes configuration: {error} (set KUBECONFIG or --kubeconfig)"
            ) from error
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        except kubernetes.config.ConfigException as in_cluster_error:
            raise Unavailable(f"in-cluster configuration: {in_cluster_error}") from error
        namespace = _in_cluster_namespace()
    return Cluster(kubernetes.client.ApiClient(configuration), namespace, configuration.host)


def _in_cluster_namespace() -> str:
    try:
        return _SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def fetch(
    cluster: Cluster, namespace: str | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The guarded CronJobs in `namespace` (None: every namespace) and their namespaces' Leases."""
    batch = kubernetes.client.BatchV1Api(cluster.api)
    coordination = kubernetes.client.CoordinationV1Api(cluster.api)
    where = "in all namespaces" if namespace is None else f"in namespace {namespace}"
    with _refusal(cluster, f"list cronjobs.batch {where}"):
        if namespace is None:
            listed = batch.list_cron_job_for_all_namespaces(_request_timeout=_REQUEST_TIMEOUT)
        else:
            listed = batch.list_namespaced_cron_job(namespace, _request_timeout=_REQUEST_TIMEOUT)
    cronjobs = [
        item
        for item in cluster.api.sanitize_for_serialization(listed).get("items") or []
        if _annotations(item).get(contract.ANNOTATION_ENABLED) == "true"
    ]
    leases: list[dict[str, Any]] = []
    for lease_namespace in sorted({_metadata(item).get("namespace", "") for item in cronjobs}):
        with _refusal(cluster, f"list leases.coordination.k8s.io in namespace {lease_namespace}"):
            listed = coordination.list_namespaced_lease(
                lease_namespace, _request_timeout=_REQUEST_TIMEOUT
            )
        leases.extend(cluster.api.sanitize_for_serialization(listed).get("items") or [])
    return cronjobs, leases


@contextmanager
def _refusal(cluster: Cluster, what: str) -> Iterator[None]:
    """Turn API errors into Unavailable naming the request that failed."""
    try:
        yield
    except kubernetes.client.ApiException as error:
        reason = _server_message(error) or f"HTTP {error.status} {error.reason}"
        verdict = {401: "unauthorized", 403: "forbidden"}.get(error.status, "refused")
        raise Unavailable(f"cannot {what}: {verdict}: {reason}") from error
    except urllib3.exceptions.MaxRetryError as error:
        raise Unavailable(
            f"cannot {what}: API server {cluster.server} unreachable: {error.reason or error}"
        ) from error
    except (urllib3.exceptions.HTTPError, OSError) as error:
        raise Unavailable(
            f"cannot {what}: API server {cluster.server} unreachable: {error}"
        ) from error


def _server_message(error: Any) -> str:
    try:
        body = json.loads(error.body or "")
    except (TypeError, ValueError):
        return ""
    return str(body.get("message", "")) if isinstance(body, dict) else ""


# --- the command line -----------------------------------------------------------------


def parser(prog: str = "cronlock") -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog=prog,
        description="Inspect the Leases that keep cronlock-guarded CronJob runs from overlapping.",
    )
    commands = top.add_subparsers(dest="command", metavar="COMMAND")
    status = commands.add_parser(
        "status",
        help="show who holds each guarded CronJob's lock",
        description=(
            "Show every CronJob annotated cronlock.io/enabled=true with its Lease. Exit 0 when "
            "all is well, 1 when a Lease is expired but still held or a CronJob reached its "
            "cronlock.io/alert-after consecutive skips, 2 on usage errors, 69 when the API "
            "server is unreachable or refuses."
        ),
    )
    scope = status.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        help="namespace to show (default: the kubeconfig context's namespace, else default)",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="show every namespace")
    status.add_argument(
        "-o", "--output", choices=("table", "json", "wide"), default="table", help="output format"
    )
    status.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help=f"redraw every {WATCH_INTERVAL_SECONDS:g}s until Ctrl-C",
    )
    status.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)"
    )
    status.add_argument("--context", help="kubeconfig context to use")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    prog = "kubectl cronlock" if Path(sys.argv[0]).name.startswith("kubectl-") else "cronlock"
    top = parser(prog)
    args = top.parse_args(argv)
    if args.command is None:
        top.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        cluster = connect(args.kubeconfig, args.context)
    except UsageError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except Unavailable as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    namespace = None if args.all_namespaces else (args.namespace or cluster.namespace)
    try:
        if args.watch:
            return _watch(cluster, namespace, args.output, prog)
        return _show_once(cluster, namespace, args.output, prog)
    finally:
        cluster.api.close()


def _show_once(cluster: Cluster, namespace: str | None, output: Output, prog: str) -> int:
    try:
        status_rows = _snapshot(cluster, namespace)
    except Unavailable as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if not status_rows and output != "json":
        # Like kubectl's "No resources found": on stderr, so stdout stays parseable.
        print(_nothing_found(namespace), file=sys.stderr)
    else:
        print(_render(status_rows, namespace, output))
    for row in status_rows:
        for problem in row.problems:
            print(f"{prog}: warning: {problem}", file=sys.stderr)
    return exit_code(status_rows)


def _watch(cluster: Cluster, namespace: str | None, output: Output, prog: str) -> int:
    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() and output != "json" else ""
    try:
        while True:
            try:
                status_rows = _snapshot(cluster, namespace)
                screen = _render(status_rows, namespace, output, compact=True)
            except Unavailable as error:
                # A hiccup while watching is shown and retried, not the end of the watch;
                # JSON Lines on stdout stay parseable, so there it goes to stderr.
                if output == "json":
                    print(f"{prog}: {error}", file=sys.stderr, flush=True)
                    _pause(WATCH_INTERVAL_SECONDS)
                    continue
                screen = f"{prog}: {error}"
            stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            header = "" if output == "json" else f"Every {WATCH_INTERVAL_SECONDS:g}s: {stamp}\n\n"
            sys.stdout.write(f"{clear}{header}{screen}\n")
            sys.stdout.flush()
            _pause(WATCH_INTERVAL_SECONDS)
    except KeyboardInterrupt:
        if output != "json":
            sys.stdout.write("\n")
        return EXIT_OK


def _pause(seconds: float) -> None:
    time.sleep(seconds)


def _snapshot(cluster: Cluster, namespace: str | None) -> list[StatusRow]:
    cronjobs, leases = fetch(cluster, namespace)
    return rows(cronjobs, leases, datetime.now(UTC))


def _render(
    status_rows: Sequence[StatusRow],
    namespace: str | None,
    output: Output,
    *,
    compact: bool = False,
) -> str:
    if output == "json":
        if compact:
            return json.dumps([_json_row(row) for row in status_rows])
        return render_json(status_rows)
    if not status_rows:
        return _nothing_found(namespace)
    width = shutil.get_terminal_size((_UNBOUNDED_WIDTH, 24)).columns
    return render_table(status_rows, width, all_namespaces=namespace is None, wide=output == "wide")


def _nothing_found(namespace: str | None) -> str:
    where = "any namespace" if namespace is None else f"namespace {namespace}"
    return f"No guarded CronJobs (annotated {contract.ANNOTATION_ENABLED}=true) in {where}."
