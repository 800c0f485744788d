"""Kubernetes MicroTime: the API stores six fractional digits, so we always write six."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_MICROTIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
    r"(?:([Zz])|([+-])(\d{2}):?(\d{2}))$"
)


class MicroTimeError(ValueError):
    """A timestamp that is not RFC 3339."""


def format_microtime(moment: datetime) -> str:
    """RFC 3339 in UTC with exactly six fractional digits and a `Z`."""
    if moment.tzinfo is None:
        raise ValueError("a MicroTime needs a timezone-aware datetime")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_microtime(text: str) -> datetime:
    """An aware UTC datetime from any RFC 3339 timestamp (any number of fractional digits)."""
    match = _MICROTIME.match(text.strip())
    if match is None:
        raise MicroTimeError(f"{text!r} is not an RFC 3339 timestamp")
    year, month, day, hour, minute, second = (int(part) for part in match.group(1, 2, 3, 4, 5, 6))
    fraction = (match.group(7) or "")[:6].ljust(6, "0")
    try:
        moment = datetime(year, month, day, hour, minute, second, int(fraction), tzinfo=UTC)
    except ValueError as error:
        raise MicroTimeError(f"{text!r} is not a valid timestamp: {error}") from error
    if match.group(9) is not None:
        offset = timedelta(hours=int(match.group(10)), minutes=int(match.group(11)))
        moment -= offset if match.group(9) == "+" else -offset
    return moment


def read_time(value: object) -> datetime | None:
    """A timestamp read from an object's field: None when absent or not RFC 3339."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_microtime(value)
    except MicroTimeError:
        return None
