"""Schedule ticks as the CronJob controller (robfig/cron) finds them: the operator's missed
runs and the TTL-gap warning, and `cronlock-sidecar run --schedule`'s nominal tick. Standard
library only; the sidecar imports it only when `--schedule` is given (start-up budget)."""

from __future__ import annotations

import datetime
import functools
import itertools
import re
import zoneinfo
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import Final

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

_UTC: Final = datetime.UTC
_EPOCH_ORDINAL: Final = datetime.date(1970, 1, 1).toordinal()
_SECOND: Final = datetime.timedelta(seconds=1)
_GO_INT: Final = re.compile(r"[+-]?[0-9]+")
# Go's unicode.IsSpace: what strings.Fields splits on and strings.TrimSpace trims.
_GO_SPACE: Final = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_GO_FIELD: Final = re.compile(f"[^{_GO_SPACE}]+")
_NANOS_PER_UNIT: Final = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,
    "\u03bcs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_NANOS_PER_SECOND: Final = 1_000_000_000
_NANOS_LIMIT: Final = 1 << 63


@dataclass(frozen=True)
class _Field:
    """One cron field: the values it matches and whether it was written as `*` (or `?`)."""

    values: frozenset[int]
    star: bool


@dataclass(frozen=True)
class _Fields:
    """The five fields of a standard schedule."""

    minute: _Field
    hour: _Field
    day_of_month: _Field
    month: _Field
    day_of_week: _Field


@dataclass(frozen=True)
class _Spec:
    """A five-field schedule (or a descriptor such as @daily) and the zone it ticks in."""

    fields: _Fields
    zone: datetime.tzinfo


@dataclass(frozen=True)
class _Every:
    """`@every D`: ticks D apart from the anchor, D whole seconds (robfig truncates it)."""

    seconds: int


def min_gap_seconds(schedule: str) -> float | None:
    """The shortest time between two consecutive ticks; None when unparsable or never ticking.

    Follows the parser Kubernetes uses (robfig/cron, standard five fields plus descriptors).
    A `CRON_TZ=`/`TZ=` prefix is ignored: daylight-saving shifts are not counted.
    """
    return _min_gap_seconds(schedule.strip())


def ticks_between(
    schedule: str,
    time_zone: str | None,
    after: datetime.datetime,
    until: datetime.datetime,
    limit: int,
    anchor: datetime.datetime | None = None,
) -> list[datetime.datetime] | None:
    """The schedule's ticks T with after < T <= until, earliest first, at most `limit`;
    UTC-aware datetimes in and out. None when the schedule cannot be parsed or its time
    zone is unknown here.

    `time_zone` is the CronJob's spec.timeZone (None: UTC, as the controller runs). `anchor`
    is where `@every D` counts from (the CronJob's lastScheduleTime, else its
    creationTimestamp): its ticks are anchor + k·D, k >= 1, the anchor cut to the second;
    without an anchor `@every` gives None. Other schedules ignore it and tick as robfig's
    SpecSchedule.Next steps from `after`, to the second and with its daylight-saving ways: a
    wall time the clocks skip does not run that day, one they repeat runs twice.
    """
    parsed = _parse_for_cronjob(schedule, time_zone)
    if parsed is None:
        return None
    start = _unix_seconds(after)
    end = _unix_seconds(until)
    if isinstance(parsed, _Every):
        if anchor is None:
            return None
        base = _unix_seconds(anchor)
        first = max(1, (start - base) // parsed.seconds + 1)
        last = (end - base) // parsed.seconds
        count = max(0, min(limit, last - first + 1))
        return [_from_unix(base + k * parsed.seconds) for k in range(first, first + count)]
    ticks: list[datetime.datetime] = []
    tick = start
    while len(ticks) < limit:
        following = _spec_next(parsed, tick)
        if following is None or following > end:
            break
        tick = following
        ticks.append(_from_unix(tick))
    return ticks


def next_tick(
    schedule: str,
    time_zone: str | None,
    after: datetime.datetime,
    anchor: datetime.datetime | None = None,
) -> datetime.datetime | None:
    """The first tick after `after`; None when unparsable, unknown zone, or none within ~5 years.

    As robfig/cron: a five-field schedule looks five years ahead; `@every D` (from `anchor`,
    as in `ticks_between`) always has a next tick.
    """
    parsed = _parse_for_cronjob(schedule, time_zone)
    if parsed is None:
        return None
    start = _unix_seconds(after)
    if isinstance(parsed, _Every):
        if anchor is None:
            return None
        base = _unix_seconds(anchor)
        return _from_unix(base + max(1, (start - base) // parsed.seconds + 1) * parsed.seconds)
    tick = _spec_next(parsed, start)
    return None if tick is None else _from_unix(tick)


@functools.lru_cache(maxsize=1024)
def _min_gap_seconds(schedule: str) -> float | None:
    fields = schedule.split()
    if fields and (fields[0].startswith("CRON_TZ=") or fields[0].startswith("TZ=")):
        fields = fields[1:]
    if len(fields) == 2 and fields[0] == "@every":
        nanos = _go_duration_nanos(fields[1])
        return None if nanos is None else float(_every_seconds(nanos))
    if len(fields) == 1 and fields[0].startswith("@"):
        macro = _MACROS.get(fields[0].lower())
        if macro is None:
            return None
        fields = macro.split()
    parsed = _parse_fields(fields)
    if parsed is None:
        return None

    times = sorted(h * 60 + m for h in parsed.hour.values for m in parsed.minute.values)
    matches_some_day, day_gap = _shortest_day_gap(
        parsed.day_of_month, parsed.month, parsed.day_of_week
    )
    if not matches_some_day:
        return None
    if day_gap is None:
        return None if len(times) < 2 else _shortest_gap_in_day(times) * 60.0
    across_days = times[0] + day_gap * _MINUTES_PER_DAY - times[-1]
    if len(times) < 2:
        return across_days * 60.0
    return min(_shortest_gap_in_day(times), across_days) * 60.0


def _parse_fields(fields: list[str]) -> _Fields | None:
    if len(fields) != 5:
        return None
    try:
        return _Fields(
            minute=_parse_field(fields[0], 0, 59, {}),
            hour=_parse_field(fields[1], 0, 23, {}),
            day_of_month=_parse_field(fields[2], 1, 31, {}),
            month=_parse_field(fields[3], 1, 12, _MONTHS),
            day_of_week=_parse_field(fields[4], 0, 6, _WEEKDAYS),
        )
    except ValueError:
        return None


def _every_seconds(nanos: int) -> int:
    # robfig/cron's Every: at least one second, then cut to whole seconds.
    return max(nanos, _NANOS_PER_SECOND) // _NANOS_PER_SECOND


@functools.lru_cache(maxsize=1024)
def _parse_for_cronjob(schedule: str, time_zone: str | None) -> _Spec | _Every | None:
    """What the controller parses: the schedule, prefixed `TZ=<spec.timeZone>` unless it
    names a zone itself (formatSchedule in pkg/controller/cronjob); with an unknown
    spec.timeZone the controller starts nothing."""
    if time_zone is not None and "TZ" not in schedule:
        if _load_zone(time_zone) is None:
            return None
        schedule = f"TZ={time_zone} {schedule}"
    return _parse_standard(schedule)


def _parse_standard(spec: str) -> _Spec | _Every | None:
    """robfig/cron's ParseStandard; None where it errs (or panics: `TZ=X` with no space)."""
    if not spec:
        return None
    zone: datetime.tzinfo = _UTC  # time.Local: the controller runs in UTC
    if spec.startswith(("TZ=", "CRON_TZ=")):
        space = spec.find(" ")
        named = None if space < 0 else _load_zone(spec[spec.find("=") + 1 : space])
        if named is None:
            return None
        zone = named
        spec = spec[space:].strip(_GO_SPACE)
    if spec.startswith("@"):
        if spec.startswith("@every "):
            nanos = _go_duration_nanos(spec.removeprefix("@every "))
            return None if nanos is None else _Every(_every_seconds(nanos))
        macro = _MACROS.get(spec)  # robfig matches descriptors exactly, case and all
        if macro is None:
            return None
        spec = macro
    fields = _parse_fields(_GO_FIELD.findall(spec))
    return None if fields is None else _Spec(fields, zone)


def _load_zone(name: str) -> datetime.tzinfo | None:
    """time.LoadLocation: "" and "UTC" are UTC, "Local" the controller's own (UTC)."""
    if name in ("", "UTC", "Local"):
        return _UTC
    try:
        return zoneinfo.ZoneInfo(name)
    except (ValueError, OSError, zoneinfo.ZoneInfoNotFoundError):
        return None


def _go_duration_nanos(text: str) -> int | None:
    """Go's time.ParseDuration, in whole nanoseconds; None where it errs."""
    negative = text[:1] == "-"
    rest = text[1:] if text[:1] in ("-", "+") else text
    if rest == "0":
        return 0
    if not rest:
        return None
    total = 0
    while rest:
        whole = re.match(r"[0-9]*", rest)
        assert whole is not None
        digits = whole.group()
        rest = rest[len(digits) :]
        fraction = ""
        has_point = rest[:1] == "."
        if has_point:
            fraction_match = re.match(r"[0-9]*", rest[1:])
            assert fraction_match is not None
            fraction = fraction_match.group()
            rest = rest[1 + len(fraction) :]
        if not digits and not fraction:
            return None
        unit_match = re.match(r"[^0-9.]*", rest)
        assert unit_match is not None
        unit = _NANOS_PER_UNIT.get(unit_match.group())
        if unit is None:
            return None
        rest = rest[len(unit_match.group()) :]
        value = int(digits) if digits else 0
        if value > _NANOS_LIMIT // unit:
            return None
        value *= unit
        numerator, scale = _leading_fraction(fraction)
        if numerator > 0:
            # As Go: float64 arithmetic, then truncated.
            value += int(float(numerator) * (float(unit) / scale))
            if value > _NANOS_LIMIT:
                return None
        total += value
        if total > _NANOS_LIMIT:
            return None
    if negative:
        return -total
    return None if total > _NANOS_LIMIT - 1 else total


def _leading_fraction(digits: str) -> tuple[int, float]:
    """Go's leadingFraction: the digits as a number and its scale, ignoring digits past
    what fits in 63 bits."""
    number = 0
    scale = 1.0
    for digit in digits:
        if number > (_NANOS_LIMIT - 1) // 10:
            break
        following = number * 10 + int(digit)
        if following > _NANOS_LIMIT:
            break
        number = following
        scale *= 10
    return number, scale


def _unix_seconds(moment: datetime.datetime) -> int:
    """Whole seconds since the epoch, rounded down (robfig drops the nanoseconds)."""
    if moment.tzinfo is None:
        raise ValueError(f"{moment!r} has no time zone; pass a UTC-aware datetime")
    return (moment - datetime.datetime(1970, 1, 1, tzinfo=_UTC)) // _SECOND


def _from_unix(seconds: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, _UTC)


def _spec_next(spec: _Spec, after: int) -> int | None:
    """robfig/cron's SpecSchedule.Next on whole Unix seconds, step for step (each loop's
    reset, its wrap back to the top, its daylight-saving nudges) except that a run of
    steps with no change of UTC offset is taken as one jump."""
    fields = spec.fields
    zone = spec.zone
    t = after + 1
    wall = _wall(zone, t)
    year_limit = wall.year + 5
    added = False
    while True:  # robfig's WRAP label; `wall` is always `t` on the zone's clock
        if wall.year > year_limit:
            return None
        wrapped = False
        while wall.month not in fields.month.values:
            if not added:
                added = True
                t = _go_date(zone, wall.year, wall.month, 1, 0, 0, 0)
                wall = _wall(zone, t)
            t = _go_date(
                zone, wall.year, wall.month + 1, wall.day, wall.hour, wall.minute, wall.second
            )
            wall = _wall(zone, t)
            if wall.month == 1:
                wrapped = True
                break
        if wrapped:
            continue
        while not _day_matches(fields, wall):
            if not added:
                added = True
                t = _go_date(zone, wall.year, wall.month, wall.day, 0, 0, 0)
                wall = _wall(zone, t)
            t = _go_date(
                zone, wall.year, wall.month, wall.day + 1, wall.hour, wall.minute, wall.second
            )
            wall = _wall(zone, t)
            # robfig's nudge for a midnight that daylight saving moved.
            if wall.hour != 0:
                t += (24 - wall.hour) * 3600 if wall.hour > 12 else -wall.hour * 3600
                wall = _wall(zone, t)
            if wall.day == 1:
                wrapped = True
                break
        if wrapped:
            continue
        if wall.hour not in fields.hour.values:
            if not added:
                added = True
                t = _go_date(zone, wall.year, wall.month, wall.day, wall.hour, 0, 0)
                wall = _wall(zone, t)
            t, wall, wrapped = _advance(zone, t, wall, 3600, 24, _hour_of, fields.hour.values)
            if wrapped:
                continue
        if wall.minute not in fields.minute.values:
            if not added:
                added = True
                t -= t % 60
                wall = _wall(zone, t)
            t, wall, wrapped = _advance(zone, t, wall, 60, 60, _minute_of, fields.minute.values)
            if wrapped:
                continue
        if wall.second != 0:
            added = True
            t, wall, wrapped = _advance(zone, t, wall, 1, 60, _second_of, (0,))
            continue
        return t


def _advance(
    zone: datetime.tzinfo,
    t: int,
    wall: datetime.datetime,
    unit: int,
    period: int,
    value_of: Callable[[datetime.datetime], int],
    values: Container[int],
) -> tuple[int, datetime.datetime, bool]:
    """robfig's inner loop: add `unit` seconds until the field matches (False) or wraps to
    0 (True, back to the top). Where the offset is the same at both ends, one jump."""
    current = value_of(wall)
    target = next((value for value in range(current + 1, period) if value in values), period)
    jump = t + (target - current) * unit
    landed = _wall(zone, jump)
    if landed.utcoffset() == wall.utcoffset() and value_of(landed) == target % period:
        return jump, landed, target == period
    while True:
        t += unit
        wall = _wall(zone, t)
        value = value_of(wall)
        if value == 0:
            return t, wall, True
        if value in values:
            return t, wall, False


def _hour_of(wall: datetime.datetime) -> int:
    return wall.hour


def _minute_of(wall: datetime.datetime) -> int:
    return wall.minute


def _second_of(wall: datetime.datetime) -> int:
    return wall.second


def _day_matches(fields: _Fields, wall: datetime.datetime) -> bool:
    dom = wall.day in fields.day_of_month.values
    dow = wall.isoweekday() % 7 in fields.day_of_week.values
    # Cron's rule: when either day field is `*`, both must match; otherwise either may.
    if fields.day_of_month.star or fields.day_of_week.star:
        return dom and dow
    return dom or dow


def _wall(zone: datetime.tzinfo, t: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(t, zone)


def _offset(zone: datetime.tzinfo, t: int) -> int:
    offset = _wall(zone, t).utcoffset()
    return 0 if offset is None else offset // _SECOND


def _go_date(
    zone: datetime.tzinfo, year: int, month: int, day: int, hour: int, minute: int, second: int
) -> int:
    """Go's time.Date: fields past their range carry over; a wall time that a change of
    offset skips or repeats resolves as Go's offset look-up does (not as Python's fold)."""
    year += (month - 1) // 12
    month = (month - 1) % 12 + 1
    days = datetime.date(year, month, 1).toordinal() - _EPOCH_ORDINAL + day - 1
    local = days * 86400 + hour * 3600 + minute * 60 + second
    offset = _offset(zone, local)
    if offset != 0:
        offset = _offset(zone, local - offset)
    return local - offset


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
    """One field as robfig/cron reads it: comma-separated ranges, empty ones ignored."""
    values: set[int] = set()
    star = False
    for part in text.split(","):
        if not part:
            continue
        matched, part_star = _parse_range(part, low, high, names)
        values |= matched
        star = star or part_star
    return _Field(frozenset(values), star)


def _parse_range(text: str, low: int, high: int, names: dict[str, int]) -> tuple[set[int], bool]:
    range_and_step = text.split("/")
    if len(range_and_step) > 2:
        raise ValueError(text)
    bounds = range_and_step[0].split("-")
    # robfig reads `*` or `?` before a hyphen as the whole range, and ignores the rest.
    star = bounds[0] in ("*", "?")
    if star:
        start, end = low, high
    else:
        if len(bounds) > 2:
            raise ValueError(text)
        start = _parse_value(bounds[0], names)
        end = _parse_value(bounds[1], names) if len(bounds) == 2 else start
    step = 1
    if len(range_and_step) == 2:
        step = _parse_number(range_and_step[1])
        if len(bounds) == 1:
            end = high  # "N/step" means "N-max/step"
        star = star and step <= 1
    if not low <= start <= end <= high or step == 0:
        raise ValueError(text)
    return set(range(start, end + 1, step)), star


def _parse_value(text: str, names: dict[str, int]) -> int:
    if text.lower() in names:
        return names[text.lower()]
    return _parse_number(text)


def _parse_number(text: str) -> int:
    """A number as Go's strconv.Atoi reads it (ASCII digits, optional sign), not negative."""
    if _GO_INT.fullmatch(text) is None or int(text) < 0:
        raise ValueError(text)
    return int(text)


# `run --schedule`: the longest --tick-window (a day), which also bounds the ticks stepped.
LONGEST_TICK_WINDOW_SECONDS: Final = 24 * 3600.0


def refusal(schedule: str, time_zone: str | None) -> str | None:
    """Why a process outside Kubernetes cannot take its ticks from `schedule` (in
    `time_zone`, as a CronJob's spec.timeZone), in words a user can act on; None if it can."""
    named_in_schedule = schedule.startswith(("TZ=", "CRON_TZ="))
    if time_zone is not None:
        if named_in_schedule:
            return (
                f"{schedule!r} names its time zone already (TZ=…); give the zone one way, "
                "--time-zone or the prefix"
            )
        if _load_zone(time_zone) is None:
            return (
                f"unknown time zone {time_zone!r}; expected an IANA name such as "
                "Europe/Berlin or America/New_York (or UTC)"
            )
    parsed = _parse_for_cronjob(schedule, time_zone)
    if parsed is None:
        if named_in_schedule:
            space = schedule.find(" ")
            zone = schedule[schedule.find("=") + 1 : space if space >= 0 else None]
            if space < 0 or _load_zone(zone) is None:
                return (
                    f"unknown time zone {zone!r} in {schedule!r}; expected TZ=<IANA name> "
                    "and a space before the schedule, e.g. 'TZ=Europe/Berlin 0 3 * * *'"
                )
        return (
            f"{schedule!r} is not a schedule the CronJob controller (robfig/cron) accepts; "
            "expected five fields MINUTE HOUR DAY-OF-MONTH MONTH DAY-OF-WEEK (e.g. "
            "'*/5 * * * *') or @yearly, @monthly, @weekly, @daily, @hourly"
        )
    if isinstance(parsed, _Every):
        return (
            f"{schedule!r}: @every counts from a CronJob's last schedule time, which a process "
            "outside Kubernetes does not know; name the times (e.g. '*/5 * * * *') or give "
            "--tick"
        )
    if _spec_next(parsed, _unix_seconds(datetime.datetime.now(_UTC))) is None:
        return f"{schedule!r} never ticks (no time in the next five years matches it)"
    return None


def latest_tick(
    schedule: str, time_zone: str | None, now: datetime.datetime, window_seconds: float
) -> datetime.datetime | None:
    """The latest tick T of `schedule` with now - window <= T <= now (UTC-aware), None when
    there is none in the window or `refusal` has a reason. The tick a cron firing at T names,
    whether its process starts at T + 0.4 s or, on a slow machine, at T + 59 s."""
    window = datetime.timedelta(seconds=min(window_seconds, LONGEST_TICK_WINDOW_SECONDS))
    # Five-field schedules tick at most once a minute, twice in a repeated daylight-saving hour.
    limit = 2 * (int(window.total_seconds()) // 60) + 4
    found = ticks_between(schedule, time_zone, now - window - _SECOND, now, limit)
    if not found:
        return None
    tick = found[-1]
    return tick if tick >= now - window else None
