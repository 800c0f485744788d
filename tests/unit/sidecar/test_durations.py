"""Go durations read without `re` (the gate's path) read exactly what the pattern the
admission policy checks with says, and mean what the pattern's parts add up to."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cronlock_sidecar.lock.durations import _PART_PATTERN, DurationError, parse_duration

UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
WHOLE = re.compile(f"(?:{_PART_PATTERN})+", re.ASCII)
PART = re.compile(_PART_PATTERN, re.ASCII)


def by_pattern(text: str) -> float | None:
    """What the pattern reads: the sum of its parts, None when it does not match."""
    value = text.strip()
    if value == "0":
        return 0.0
    if not WHOLE.fullmatch(value):
        return None
    return sum(float(number) * UNITS[unit] for number, unit in PART.findall(value))


def read(text: str) -> float | None:
    try:
        return parse_duration(text)
    except DurationError:
        return None


# \u0661 is ARABIC-INDIC DIGIT ONE: Python's `re` reads it as \d unless told ASCII; Go and
# CEL do not, and neither does the parser now.
@given(st.text(alphabet="0123456789.nsumhµ -+eS\u0661", max_size=8))
def test_the_parser_reads_what_the_pattern_reads(text: str) -> None:
    assert read(text) == by_pattern(text)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("1m30s", 90.0),
        ("1.5h", 5400.0),
        ("1ms", 0.001),
        ("1.s", 1.0),
        (".5s", 0.5),
        ("2µs", 2e-6),
        ("0", 0.0),
        (" 3s ", 3.0),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", ".s", "1.5.5s", "5", "1m1", "m", "1mm", "-5s", "\u0661s"])
def test_not_durations(text: str) -> None:
    with pytest.raises(DurationError):
        parse_duration(text)
