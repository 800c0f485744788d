"""The shortest gap between two ticks of a CronJob schedule, to warn when the TTL outlasts it."""

from __future__ import annotations

import datetime
import functools
import itertools
from dataclasses import dataclass
from typing import Final

from cronlock_operator.lock.config import LockConfig
from cronlock_sidecar.lock.durations import DurationError, format_duration, parse_duration

_MACROS: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS: Final = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        start=1,
    )
}
_WEEKDAYS: Final = {
    name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))
}
# The Gregorian calendar's weekdays repeat every 28 years between 1901 and 2099, so
# looking at 28 years sees every way a day-of-month and a day-of-week can line up.
_FIRST_DAY: Final = datetime.date(2001, 1, 1)
_DAYS_SEEN: Final = (datetime.date(2029, 1, 1) - _FIRST_DAY).days
_MINUTES_PER_DAY: Final = 24 * 60


@dataclass(frozen=True)
class _Field:
    """One cron field: the values it matches and whether it was written as `*` (or `?`)."""

    values: frozenset[int]
    star: bool


def min_gap_seconds(schedule: str) -> float | None:
    """The shortest time between two consecutive ticks; None when unparsable or never ticking.

    Follows the parser Kubernetes uses (robfig/cron, standard five fields plus descriptors).
    A `CRON_TZ=`/`TZ=` prefix is ignored: daylight-saving shifts are not counted.
    """
    return _min_gap_seconds(schedule.strip())


def ttl_longer_than_gap_warning(config: LockConfig, schedule: str) -> str | None:
    """A warning for the CronJob when a dead run could block more than one later run."""
    gap = min_gap_seconds(schedule)
    if gap is None or config.ttl_seconds <= gap:
        return None
    return (
        f"ttl {format_duration(config.ttl_seconds)} is longer than the shortest gap between "
        f"two runs of the schedule {schedule!r} ({format_duration(gap)}): a run that dies "
        "holding the lock could block more than one later run; consider a shorter cronlock.io/ttl"
    )


@functools.lru_cache(maxsize=1024)
def _min_gap_seconds(schedule: str) -> float | None:
    fields = schedule.split()
    if fields and (fields[0].startswith("CRON_TZ=") or fields[0].startswith("TZ=")):
        fields = fields[1:]
    if len(fields) == 2 and fields[0] == "@every":
        return _every_seconds(fields[1])
    if len(fields) == 1 and fields[0].startswith("@"):
        macro = _MACROS.get(fields[0].lower())
        if macro is None:
            return None
        fields = macro.split()
    if len(fields) != 5:
        return None
    try:
        minute = _parse_field(fields[0], 0, 59, {})
        hour = _parse_field(fields[1], 0, 23, {})
        day_of_month = _parse_field(fields[2], 1, 31, {})
        month = _parse_field(fields[3], 1, 12, _MONTHS)
        day_of_week = _parse_field(fields[4], 0, 6, _WEEKDAYS)
    except ValueError:
        return None

    times = sorted(h * 60 + m for h in hour.values for m in minute.values)
    matches_some_day, day_gap = _shortest_day_gap(day_of_month, month, day_of_week)
    if not matches_some_day:
        return None
    if day_gap is None:
        return None if len(times) < 2 else _shortest_gap_in_day(times) * 60.0
    across_days = times[0] + day_gap * _MINUTES_PER_DAY - times[-1]
    if len(times) < 2:
        return across_days * 60.0
    return min(_shortest_gap_in_day(times), across_days) * 60.0


def _every_seconds(text: str) -> float | None:
    try:
        seconds = parse_duration(text)
    except DurationError:
        return None
    # robfig/cron rounds @every down to whole seconds, with a floor of one second.
    return float(max(1, int(seconds)))


def _shortest_gap_in_day(times: list[int]) -> int:
    return min(later - earlier for earlier, later in itertools.pairwise(times))


def _shortest_day_gap(
    day_of_month: _Field, month: _Field, day_of_week: _Field
) -> tuple[bool, int | None]:
    """Whether any day matches, and the fewest days between two that do (None: one only)."""
    previous: int | None = None
    shortest: int | None = None
    for offset in range(_DAYS_SEEN):
        day = _FIRST_DAY + datetime.timedelta(days=offset)
        if day.month not in month.values:
            continue
        dom = day.day in day_of_month.values
        dow = day.isoweekday() % 7 in day_of_week.values
        # Cron's rule: when either day field is `*`, both must match; otherwise either may.
        matches = (dom and dow) if day_of_month.star or day_of_week.star else (dom or dow)
        if not matches:
            continue
        if previous is not None:
            gap = offset - previous
            shortest = gap if shortest is None else min(shortest, gap)
            if shortest == 1:
                return True, 1
        previous = offset
    return previous is not None, shortest


def _parse_field(text: str, low: int, high: int, names: dict[str, int]) -> _Field:
    values: set[int] = set()
    star = False
    for part in text.split(","):
        matched, part_star = _parse_range(part, low, high, names)
        values |= matched
        star = star or part_star
    return _Field(frozenset(values), star)


def _parse_range(text: str, low: int, high: int, names: dict[str, int]) -> tuple[set[int], bool]:
    range_text, _, step_text = text.partition("/")
    star = range_text in ("*", "?")
    if star:
        start, end = low, high
    else:
        bounds = range_text.split("-")
        if len(bounds) > 2:
            raise ValueError(text)
        start = _parse_value(bounds[0], names)
        end = _parse_value(bounds[1], names) if len(bounds) == 2 else start
        if step_text and len(bounds) == 1:
            end = high  # "N/step" means "N-max/step"
    step = 1
    if step_text:
        if not step_text.isdigit() or int(step_text) == 0:
            raise ValueError(text)
        step = int(step_text)
        star = star and step == 1
    if not low <= start <= end <= high:
        raise ValueError(text)
    return set(range(start, end + 1, step)), star


def _parse_value(text: str, names: dict[str, int]) -> int:
    if text.lower() in names:
        return names[text.lower()]
    if not text.isdigit():
        raise ValueError(text)
    return int(text)
