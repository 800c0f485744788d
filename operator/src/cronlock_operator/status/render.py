"""How `cronlock status` shows its rows: kubectl-like tables that fit the terminal, JSON."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final

import yaml

from cronlock_operator.status.model import StatusRow, human_duration, seconds_between
from cronlock_sidecar.lock.ticks import TickRecord, format_tick

_GAP: Final = "   "
_NONE: Final = "-"
_ELLIPSIS: Final = "…"
_HOLDER_MIN_WIDTH: Final = 16
_LAST_RESORT_MIN_WIDTH: Final = 6
# Characters a terminal acts on or that reorder or hide text: controls (C0 with ESC, DEL,
# C1), formats (bidi overrides and isolates, zero-width), line and paragraph separators,
# lone surrogates (print would fail on them) and unassigned code points.
_UNPRINTABLE_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Cn", "Zl", "Zp"})


def printable(text: str) -> str:
    """`text` safe to write to a terminal: every character in _UNPRINTABLE_CATEGORIES as
    `\\xNN`, `\\uNNNN` or `\\UNNNNNNNN`, and `\\` as `\\\\` so an escape cannot be faked.

    Lease and store fields are written by whoever holds a lock, or may write its store
    (docs/SECURITY.md): a holder or frozen-by of `\\x1b]0;...` would otherwise retitle the
    operator's terminal or clear it."""
    if text.isprintable() and "\\" not in text:
        return text  # the common case, as fast as it gets
    return "".join(_escaped(character) for character in text)


def _escaped(character: str) -> str:
    if character == "\\":
        return "\\\\"
    if unicodedata.category(character) not in _UNPRINTABLE_CATEGORIES:
        return character
    code = ord(character)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


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


def frozen_text(row: StatusRow) -> str:
    """`until <time> by <who>` while the lock is frozen (`cronlock freeze`), else `-`."""
    if row.frozen_until is None:
        return _NONE
    return f"until {_iso(row.frozen_until)} by {row.frozen_by or '?'}"


def next_text(row: StatusRow) -> str:
    """`in 3m12s` until the next tick; `suspended` while no tick starts a run."""
    if row.suspended:
        return "suspended"
    seconds = seconds_between(row.now, row.next_run)
    return _NONE if seconds is None else f"in {human_duration(seconds)}"


def tick_text(row: StatusRow) -> str:
    """The lock's record of this CronJob's last tick: `<tick> job <job> (run <run>, holder
    <holder>, cluster <cluster>)`, or `-`."""
    record = row.last_tick
    return _NONE if record is None else f"{format_tick(record.at)} {record.who()}"


def succeeded_text(row: StatusRow) -> str:
    """The lock's last successful tick of this CronJob, or `-`."""
    record = row.last_succeeded_tick
    return _NONE if record is None else format_tick(record.at)


def holder_text(row: StatusRow) -> str:
    if row.state == "missing":
        return "missing"
    if row.state == "in-store":
        return f"(in {row.store})"
    return row.holder or _NONE


def _ago(moment: datetime | None, now: datetime) -> str:
    seconds = seconds_between(moment, now)
    return _NONE if seconds is None else f"{human_duration(seconds)} ago"


@dataclass(frozen=True)
class _Column:
    header: str
    cell: Callable[[StatusRow], str]
    # Order in which columns go when the terminal is too narrow; None = never dropped.
    drop_rank: int | None = None
    truncatable: bool = False


_NAMESPACE = _Column("NAMESPACE", lambda row: row.namespace, truncatable=True)


def lock_text(row: StatusRow) -> str:
    """The lock, and for a lock of N permits the permit the row shows: `reports#2`."""
    return row.lock if row.permits == 1 else f"{row.lock}#{row.permit}"


_COLUMNS: Final = (
    _Column("CRONJOB", lambda row: row.cronjob, truncatable=True),
    _Column("LOCK", lock_text, drop_rank=5),
    _Column("HOLDER", holder_text, truncatable=True),
    _Column("RENEWED", renewed_text, drop_rank=4),
    _Column("EXPIRES", expires_text),
    _Column("SKIPS", lambda row: str(row.consecutive_skips), drop_rank=6),
    _Column("LAST SCHEDULE", lambda row: _ago(row.last_schedule, row.now), drop_rank=3),
    _Column("LAST SUCCESS", lambda row: _ago(row.last_success, row.now), drop_rank=1),
    _Column("NEXT", next_text, drop_rank=2),
)
_WIDE_COLUMNS: Final = (
    *_COLUMNS,
    _Column("STATE", lambda row: row.state),
    _Column("GUARDED BY", lambda row: row.guarded_by),
    _Column("STORE", lambda row: row.store),
    _Column("POLICY", lambda row: row.policy),
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
    _Column("LAST TICK", tick_text),
    _Column("LAST SUCCESSFUL TICK", succeeded_text),
    _Column("FROZEN", frozen_text),
)


def render_table(
    status_rows: Sequence[StatusRow],
    width: int,
    *,
    all_namespaces: bool = False,
    wide: bool = False,
) -> str:
    """Aligned columns that fit `width`: HOLDER is truncated with … first, then columns go.
    Every cell is `printable`: the table is for a terminal."""
    columns = list(_WIDE_COLUMNS if wide else _COLUMNS)
    if all_namespaces:
        columns.insert(0, _NAMESPACE)
    if all(row.lock == row.cronjob and row.permits == 1 for row in status_rows):
        # Every lock is the default one, the CronJob's name, of one permit: LOCK says
        # nothing new.
        columns = [
            replace(column, drop_rank=0) if column.header == "LOCK" else column
            for column in columns
        ]
    cells = [[printable(column.cell(row)) for column in columns] for row in status_rows]
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


def as_list(status_rows: Sequence[StatusRow]) -> dict[str, Any]:
    """The rows as kubectl lists objects: `kind: List` with the table's fields as items."""
    return {
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {},
        "items": [json_row(row) for row in status_rows],
    }


def render_json(status_rows: Sequence[StatusRow]) -> str:
    """A List whose items have the table's fields: ISO timestamps, seconds as numbers,
    null for none. Values exact: json escapes every control and non-ASCII character."""
    return json.dumps(as_list(status_rows), indent=2)


def render_yaml(status_rows: Sequence[StatusRow]) -> str:
    """The same List as YAML; values exact, PyYAML quotes and escapes the unprintable."""
    text: str = yaml.safe_dump(as_list(status_rows), sort_keys=False)
    return text.rstrip("\n")


def json_row(row: StatusRow) -> dict[str, Any]:
    return {
        "namespace": row.namespace,
        "cronjob": row.cronjob,
        "lock": row.lock,
        "lease": row.lease,
        "store": row.store,
        "guardedBy": row.guarded_by,
        "policy": row.policy,
        "state": row.state,
        "permits": row.permits,
        "permit": row.permit if row.holder else None,
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
        "lastSuccessfulTime": _iso(row.last_success),
        "nextScheduleTime": _iso(row.next_run),
        "frozen": None
        if row.frozen_until is None
        else {"until": _iso(row.frozen_until), "by": row.frozen_by, "reason": row.frozen_reason},
        "ticks": [_record_json(record) for record in row.ticks],
        "successes": [_record_json(record) for record in row.succeeded],
        "problems": list(row.problems),
    }


def _record_json(record: TickRecord) -> dict[str, Any]:
    return {
        "cronjob": record.cronjob,
        "tick": format_tick(record.at),
        "job": record.job or None,
        "run": record.run,
        "holder": record.holder,
        "cluster": record.cluster or None,
    }


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _number(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)
