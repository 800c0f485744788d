"""Go-syntax durations (`90s`, `1m30s`, `1.5h`), the form users already write in Kubernetes."""

from __future__ import annotations

import re

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")

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
        match = _PART.match(value, position)
        if match is None:
            raise DurationError(f"{text!r} is not a duration; expected {DURATION_FORMS}")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        position = match.end()
    return total


def format_duration(seconds: float) -> str:
    """The shortest Go duration for a whole or fractional number of seconds."""
    if seconds == int(seconds):
        whole = int(seconds)
        hours, rest = divmod(whole, 3600)
        minutes, secs = divmod(rest, 60)
        text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
        return text + (f"{secs}s" if secs or not text else "")
    return f"{seconds:g}s"
