"""MicroTime: always six fractional digits out, any RFC 3339 in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from cronlock_sidecar.microtime import MicroTimeError, format_microtime, parse_microtime


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        (datetime(2026, 11, 29, 8, 0, 0, tzinfo=UTC), "2026-11-29T08:00:00.000000Z"),
        (datetime(2026, 11, 29, 8, 0, 0, 120, tzinfo=UTC), "2026-11-29T08:00:00.000120Z"),
        (
            datetime(2026, 11, 29, 9, 30, 0, tzinfo=timezone(timedelta(hours=1, minutes=30))),
            "2026-11-29T08:00:00.000000Z",
        ),
    ],
)
def test_format_writes_six_digits_in_utc(moment: datetime, text: str) -> None:
    assert format_microtime(moment) == text


def test_naive_times_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        format_microtime(datetime(2026, 11, 29, 8, 0, 0))


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-29T08:00:00Z",
        "2026-11-29T08:00:00.000000Z",
        "2026-11-29T08:00:00.000000000Z",
        "2026-11-29T09:00:00+01:00",
        "2026-11-29T07:00:00.0-01:00",
        "2026-11-29 08:00:00z",
    ],
)
def test_parse_is_lenient(text: str) -> None:
    assert parse_microtime(text) == datetime(2026, 11, 29, 8, 0, 0, tzinfo=UTC)


def test_parse_keeps_microseconds_and_drops_nanoseconds() -> None:
    assert parse_microtime("2026-11-29T08:00:00.123456789Z").microsecond == 123456
    assert parse_microtime("2026-11-29T08:00:00.5Z").microsecond == 500000


@pytest.mark.parametrize("text", ["", "yesterday", "2026-11-29T08:00:00", "2026-13-01T00:00:00Z"])
def test_parse_refuses_what_is_not_a_timestamp(text: str) -> None:
    with pytest.raises(MicroTimeError):
        parse_microtime(text)


def test_round_trip() -> None:
    moment = datetime(2026, 2, 3, 4, 5, 6, 789012, tzinfo=UTC)
    assert parse_microtime(format_microtime(moment)) == moment
