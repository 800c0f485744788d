"""The pure part of `cronlock status`: a row per guarded CronJob from CronJobs and Leases."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from cronlock_operator.cronjob.defaults import Defaults, LockDefaults
from cronlock_operator.cronjob.reading import ConfigReading, Readings, read_config
from cronlock_operator.injection.containers import defaults_as_injected
from cronlock_operator.objects import metadata_of
from cronlock_operator.reconcile import missed
from cronlock_operator.reconcile.skips import consecutive_skips
from cronlock_sidecar import contract
from cronlock_sidecar.lock.model import is_expired, read_lease
from cronlock_sidecar.lock.permits import permits_of, read_permits
from cronlock_sidecar.lock.ticks import TickRecord, records
from cronlock_sidecar.microtime import read_time

# "in-store": the lock is in Redis or PostgreSQL (cronlock.io/store), not a Lease here.
LeaseState = Literal["held", "free", "expired", "missing", "in-store"]
Kind = Literal["cronjobs", "leases"]
# LISTED: a whole list (the first, or again after 410 Gone); ADDED, MODIFIED, DELETED: a
# watch event; WATCHING: a watch (re)started; FAILED: a list or watch failed, `error` says how.
ChangeType = Literal["LISTED", "ADDED", "MODIFIED", "DELETED", "WATCHING", "FAILED"]
KINDS: Final[tuple[Kind, ...]] = ("cronjobs", "leases")

EXIT_OK: Final = 0
EXIT_ATTENTION: Final = 1


@dataclass(frozen=True)
class StatusRow:
    """One guarded CronJob and the state of its lock at `now`."""

    namespace: str
    cronjob: str
    lock: str
    lease: str
    policy: str  # what a run does when the lock is held (skip, wait, replace, observe; invalid)
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
    # `cronlock freeze`: until when every run on the lock skips (None: not frozen now).
    frozen_until: datetime | None = None
    frozen_by: str = ""
    frozen_reason: str = ""
    # The last successful run's end (status.lastSuccessfulTime) and the next tick.
    last_success: datetime | None = None
    next_run: datetime | None = None
    # Where the lock lives: "lease" (this cluster), "redis" or "postgres" (cronlock.io/store),
    # and the Secret whose key `url` reaches the store.
    store: str = "lease"
    store_secret: str | None = None
    # The rule that guards it: "annotation" (its own cronlock.io/enabled) or "namespace"
    # (its namespace's label cronlock.io/enabled=true).
    guarded_by: str = "annotation"
    # The lock's record of the last tick claimed, per CronJob name (issue 56): what its
    # Lease or store document says, records that do not read as one left out.
    ticks: tuple[TickRecord, ...] = ()
    # The lock's success records (the newest tick whose run succeeded), per CronJob name.
    succeeded: tuple[TickRecord, ...] = ()
    # A lock of N permits (cronlock.io/permits, lock/permits.py): its N, and the permit this
    # row shows (0: the Lease's spec). Such a lock has a row per held permit, or one free.
    permits: int = 1
    permit: int = 0

    @property
    def last_tick(self) -> TickRecord | None:
        """The lock's record for this row's CronJob."""
        return next((record for record in self.ticks if record.cronjob == self.cronjob), None)

    @property
    def last_succeeded_tick(self) -> TickRecord | None:
        """The lock's success record for this row's CronJob."""
        return next((record for record in self.succeeded if record.cronjob == self.cronjob), None)

    @property
    def renewed_seconds_ago(self) -> float | None:
        return seconds_between(self.renewed_at, self.now)

    @property
    def expires_in_seconds(self) -> float | None:
        """Negative once expired; None when nobody holds the lock."""
        if self.state not in ("held", "expired"):
            return None
        return seconds_between(self.now, self.expires_at)

    @property
    def last_schedule_seconds_ago(self) -> float | None:
        return seconds_between(self.last_schedule, self.now)


def rows(
    cronjobs: list[dict[str, Any]],
    leases: list[dict[str, Any]],
    now: datetime,
    *,
    skew_seconds: float = contract.DEFAULT_SKEW_SECONDS,
    stored: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
    readings: Readings,
) -> list[StatusRow]:
    """A row per guarded CronJob (annotated enabled=true, or in a namespace `readings` knows
    as labelled so and not annotated "false"), sorted by namespace and name.

    `stored`: the documents of locks kept in Redis or PostgreSQL, by (namespace, lease),
    as read from their stores (status/stores.py); a lock missing there is `in-store`.
    `readings`: the labelled namespaces, and the annotations' readings kept from one call to
    the next (`--watch`) and within one listing (a row reads its CronJob twice)."""
    by_name = {
        (metadata_of(lease).get("namespace", ""), metadata_of(lease).get("name", "")): lease
        for lease in leases
    }
    result = []
    for cronjob in cronjobs:
        # The operator's reading of the annotations, and so its rule for bad ones, under
        # the defaults its injection shows.
        settings = defaults_as_injected(cronjob, _DEFAULTS)
        reading = read_config(cronjob, settings, readings)
        if reading.enabled:
            row = _row(
                cronjob, reading, settings, by_name, now, skew_seconds, stored or {}, readings
            )
            result.extend(_permit_rows(row, by_name, stored or {}, skew_seconds))
    return sorted(result, key=lambda row: (row.namespace, row.cronjob, row.permit))


def _permit_rows(
    row: StatusRow,
    leases: Mapping[tuple[str, str], Mapping[str, Any]],
    stored: Mapping[tuple[str, str], Mapping[str, Any]],
    skew_seconds: float,
) -> list[StatusRow]:
    """`row` as it is for a lock of one permit; for a lock of N, a row per held permit
    (its holder, times and state; the CronJob's own problems on the first only), or the one
    row, free, when none is held."""
    lock = (stored if row.store != "lease" else leases).get((row.namespace, row.lease))
    count = permits_of(lock or {})
    if lock is None or count == 1:
        return [row]
    held = [permit for permit in read_permits(lock) if permit.holder]
    if not held:
        return [replace(row, permits=count, state="free", holder=None)]
    own = tuple(
        problem for problem in row.problems if not problem.startswith(f"lease {row.namespace}/")
    )
    shown: list[StatusRow] = []
    for permit in held:
        state: LeaseState = "expired" if is_expired(permit, row.now, skew_seconds) else "held"
        problems = own if not shown else ()
        if state == "expired":
            ago = (
                f"{human_duration(row.now - permit.expires_at)} ago"
                if permit.expires_at is not None
                else "long ago"
            )
            problems = (
                *problems,
                f"lease {row.namespace}/{row.lease} permit {permit.number} expired {ago} but "
                f"is still held by {permit.holder}",
            )
        shown.append(
            replace(
                row,
                permits=count,
                permit=permit.number,
                state=state,
                holder=permit.holder,
                renewed_at=permit.renewed_at,
                expires_at=permit.expires_at,
                lease_duration_seconds=permit.duration_seconds,
                problems=problems,
            )
        )
    return shown


def stored_locks(status_rows: Sequence[StatusRow]) -> list[tuple[str, str, str, str]]:
    """(namespace, lease, store, Secret) of each row whose lock is in Redis or PostgreSQL."""
    return [
        (row.namespace, row.lease, row.store, row.store_secret)
        for row in status_rows
        if row.store != "lease" and row.store_secret
    ]


def _row(
    cronjob: Mapping[str, Any],
    reading: ConfigReading,
    settings: Defaults,
    leases: Mapping[tuple[str, str], Mapping[str, Any]],
    now: datetime,
    skew_seconds: float,
    stored: Mapping[tuple[str, str], Mapping[str, Any]],
    readings: Readings,
) -> StatusRow:
    metadata = metadata_of(cronjob)
    namespace = str(metadata.get("namespace", ""))
    name = str(metadata.get("name", ""))
    lock = reading.lock
    lease_name = contract.lease_name(lock)
    config = reading.config
    store = config.store if config is not None else "lease"
    in_store = store != "lease"
    lease = (stored if in_store else leases).get((namespace, lease_name))
    record = read_lease(lease or {})
    holder = record.holder or None
    expires_at = record.expires_at
    state: LeaseState
    if in_store and lease is None:
        state = "in-store"  # not read: no access to its Secret, or no client here
    elif lease is None:
        state = "missing"
    elif holder is None:
        state = "free"
    elif is_expired(record, now, skew_seconds):
        # The same rule the sidecar uses to take a lock over: expired beyond the clock skew.
        state = "expired"
    else:
        state = "held"
    skips = consecutive_skips(cronjob)  # as the operator counts
    status: Mapping[str, Any] = cronjob.get("status") or {}
    problems = []
    alert_after = reading.alert_after  # as the operator counts
    if reading.invalid is not None:
        # What the operator refuses the same way, with an InvalidConfig Event.
        problems.append(
            f"cronjob {namespace}/{name}: {reading.invalid} (see its InvalidConfig Event; the "
            "operator leaves it as it was)"
        )
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
    failing = missed.not_succeeding(cronjob, settings, now, readings) if reading.config else None
    if failing is not None and not record.frozen(now):
        problems.append(f"cronjob {namespace}/{name}: {failing}")
    return StatusRow(
        namespace=namespace,
        cronjob=name,
        lock=lock,
        lease=lease_name,
        policy=reading.policy,
        state=state,
        holder=holder,
        renewed_at=record.renewed_at,
        expires_at=expires_at,
        lease_duration_seconds=record.duration_seconds,
        consecutive_skips=skips,
        alert_after=alert_after,
        last_schedule=read_time(status.get("lastScheduleTime")),
        last_holder=record.last_holder or None,
        released_at=record.released_at,
        suspended=bool((cronjob.get("spec") or {}).get("suspend")),
        now=now,
        problems=tuple(problems),
        frozen_until=record.frozen_until if record.frozen(now) else None,
        frozen_by=record.frozen_by if record.frozen(now) else "",
        frozen_reason=record.frozen_reason if record.frozen(now) else "",
        last_success=read_time(status.get("lastSuccessfulTime")),
        next_run=missed.next_run(cronjob, now),
        store=store,
        store_secret=config.store_secret if config is not None else None,
        guarded_by=reading.opt_in,
        ticks=_tick_records(lease),
        succeeded=_tick_records(lease, contract.ANNOTATION_SUCCEEDED_PREFIX),
    )


def _tick_records(
    lock: Mapping[str, Any] | None, prefix: str = contract.ANNOTATION_TICK_PREFIX
) -> tuple[TickRecord, ...]:
    """The tick records (or, by `prefix`, success records) on a Lease or store document;
    none when its annotations are no mapping (a store document is whatever was written to
    the store)."""
    annotations = metadata_of(lock or {}).get("annotations")
    return tuple(records(annotations, prefix)) if isinstance(annotations, Mapping) else ()


@dataclass(frozen=True)
class Change:
    """What following one kind of object (list, then watch) reported."""

    kind: Kind
    type: ChangeType
    objects: tuple[dict[str, Any], ...] = ()
    error: str = ""


@dataclass
class Mirror:
    """The CronJobs and Leases as their last list and the watch events since then have them,
    and which of the two cannot be followed right now."""

    _objects: dict[Kind, dict[tuple[str, str], dict[str, Any]]] = field(
        default_factory=lambda: {kind: {} for kind in KINDS}
    )
    _listed: set[Kind] = field(default_factory=set)
    _failures: dict[Kind, str] = field(default_factory=dict)

    def apply(self, change: Change) -> bool:
        """Take in one change; True when the table may look different after it."""
        objects = self._objects[change.kind]
        if change.type == "FAILED":
            before = self._failures.get(change.kind)
            self._failures[change.kind] = change.error
            return before != change.error
        cleared = self._failures.pop(change.kind, None) is not None
        if change.type == "WATCHING":
            return cleared
        if change.type == "LISTED":
            self._listed.add(change.kind)
            objects.clear()
        for obj in change.objects:
            key = (
                str(metadata_of(obj).get("namespace", "")),
                str(metadata_of(obj).get("name", "")),
            )
            if change.type == "DELETED":
                objects.pop(key, None)
            else:
                objects[key] = obj
        return True

    @property
    def ready(self) -> bool:
        """Both kinds listed at least once: the table can be drawn."""
        return self._listed == set(KINDS)

    @property
    def failure(self) -> str | None:
        """Why the table cannot be trusted now (the CronJobs' reason first), None when it can."""
        return next((self._failures[kind] for kind in KINDS if kind in self._failures), None)

    def cronjobs(self) -> list[dict[str, Any]]:
        return list(self._objects["cronjobs"].values())

    def leases(self) -> list[dict[str, Any]]:
        return list(self._objects["leases"].values())


def exit_code(status_rows: Iterable[StatusRow]) -> int:
    """1 when any lock is expired but still held, any CronJob reached its alert-after, or
    has not succeeded for its alert-after-missed ticks."""
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


def seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return (end - start).total_seconds()


# The annotations are checked as the operator checks them; only its defaults (ttl, renew,
# policy, skew from its flags) can differ: the ones here are the chart's, and the ones an
# injection shows replace them for its CronJob (injection.containers.defaults_as_injected).
_DEFAULTS: Final = LockDefaults()
