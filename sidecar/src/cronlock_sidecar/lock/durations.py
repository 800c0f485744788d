"""Go-syntax durations (`90s`, `1m30s`, `1.5h`), the form users already write in Kubernetes.

Read without `re`: the gate parses its wait from the environment, and `re` with the `enum`,
`functools` and `collections` it imports was most of the gate's import time, on every
guarded run's way to its work (docs/PERFORMANCE.md).
"""

from __future__ import annotations

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
# ASCII digits only, as Go reads a duration.
_DIGITS = frozenset("0123456789")
# One part as a regular expression, for what checks durations elsewhere (the chart's
# admission policy, in CEL, whose \d is ASCII too): `_part` reads exactly this.
_PART_PATTERN = r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)"

DURATION_FORMS = "a Go duration such as 90s, 5m, 1h30m or 1.5s"


class DurationError(ValueError):
    """A string that is not a Go duration."""


def parse_duration(text: str) -> float:
    """Seconds in a Go duration string; negative durations are refused."""
    value = text.strip()
    if value in {"0", ""}:
        if value == "":
            raise DurationError(f"empty duration; expected {DURATION_FORMS}")
        return 0.0
    position = 0
    total = 0.0
    while position < len(value):
        part = _part(value, position)
        if part is None:
            raise DurationError(f"{text!r} is not a duration; expected {DURATION_FORMS}")
        number, unit, position = part
        total += float(number) * _UNITS[unit]
    return total


def _part(value: str, start: int) -> tuple[str, str, int] | None:
    """One `<number><unit>` at `start` (the number `12`, `1.5`, `1.` or `.5`): the number,
    the unit and where the next part starts; None when there is none."""
    end = _digits_end(value, start)
    whole = end > start
    if end < len(value) and value[end] == ".":
        fraction = _digits_end(value, end + 1)
        if not whole and fraction == end + 1:
            return None
        end = fraction
    elif not whole:
        return None
    for width in (2, 1):  # `ms` before `m`, as Go reads `1ms`
        unit = value[end : end + width]
        if len(unit) == width and unit in _UNITS:
            return value[start:end], unit, end + width
    return None


def _digits_end(value: str, start: int) -> int:
    end = start
    while end < len(value) and value[end] in _DIGITS:
        end += 1
    return end


def format_duration(seconds: float) -> str:
    """The shortest Go duration for a whole or fractional number of seconds."""
    if seconds == int(seconds):
        whole = int(seconds)
        hours, rest = divmod(whole, 3600)
        minutes, secs = divmod(rest, 60)
        text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
        return text + (f"{secs}s" if secs or not text else "")
    return f"{seconds:g}s"
