"""The shortest gap between schedule ticks, and the warning when the TTL outlasts it."""

from __future__ import annotations

import pytest

from cronlock_operator.lock.config import parse_config
from cronlock_operator.lock.schedule import min_gap_seconds, ttl_longer_than_gap_warning
from tests.support.cronjobs import SETTINGS, make_cronjob

MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0


@pytest.mark.parametrize(
    ("schedule", "gap"),
    [
        ("* * * * *", MINUTE),
        ("*/5 * * * *", 5 * MINUTE),
        ("0,10,45 * * * *", 10 * MINUTE),
        ("0,45 * * * *", 15 * MINUTE),  # :45 to the next hour's :00
        ("5-10/5 * * * *", 5 * MINUTE),
        ("50/5 * * * *", 5 * MINUTE),  # N/step is N-59/step: 50 and 55
        ("55/10 * * * *", HOUR),
        ("0 * * * *", HOUR),
        ("@hourly", HOUR),
        ("30 9 * * *", DAY),
        ("@daily", DAY),
        ("@midnight", DAY),
        ("0 9,17 * * MON-FRI", 8 * HOUR),
        ("0 22,2 * * 1,2", 4 * HOUR),  # Monday 22:00 to Tuesday 02:00
        ("0 23 * * 1,3", 2 * DAY),
        ("0 0 * * 0", 7 * DAY),
        ("@weekly", 7 * DAY),
        ("15 10 * * sun", 7 * DAY),
        ("0 0 1 * *", 28 * DAY),  # January 31 days, but February only 28
        ("@monthly", 28 * DAY),
        ("0 0 1 1 *", 365 * DAY),
        ("@yearly", 365 * DAY),
        ("@annually", 365 * DAY),
        ("0 0 29 2 *", 1461 * DAY),
        ("0 0 13 * 5", DAY),  # day-of-month OR day-of-week: Thursday 13th, Friday 14th
        ("0 0 */2 * *", DAY),  # the 31st and the 1st
        ("0 12 * JAN,jul *", DAY),
        ("CRON_TZ=Europe/Paris 0 9 * * *", DAY),
        ("TZ=UTC */10 * * * *", 10 * MINUTE),
        ("@every 90s", 90.0),
        ("@every 1h30m", 5400.0),
        ("@every 500ms", 1.0),
    ],
)
def test_shortest_gap(schedule: str, gap: float) -> None:
    assert min_gap_seconds(schedule) == gap


@pytest.mark.parametrize(
    "schedule",
    [
        "",
        "not a schedule",
        "* * * *",
        "* * * * * *",
        "60 * * * *",
        "* 24 * * *",
        "* * 0 * *",
        "* * * 13 *",
        "* * * * 7",
        "5-1 * * * *",
        "*/0 * * * *",
        "* * * FOO *",
        "@fortnightly",
        "@every soon",
        "0 0 30 2 *",  # never ticks
    ],
)
def test_unparsable_or_never_ticking_schedule_has_no_gap(schedule: str) -> None:
    assert min_gap_seconds(schedule) is None


def test_warning_when_ttl_outlasts_the_gap() -> None:
    config = parse_config(
        make_cronjob(annotations={"cronlock.io/enabled": "true", "cronlock.io/ttl": "10m"}),
        SETTINGS,
    )
    warning = ttl_longer_than_gap_warning(config, "*/5 * * * *")
    assert warning is not None
    assert "10m" in warning
    assert "5m" in warning
    assert "more than one" in warning
    assert ttl_longer_than_gap_warning(config, "*/10 * * * *") is None
    assert ttl_longer_than_gap_warning(config, "@hourly") is None
    assert ttl_longer_than_gap_warning(config, "garbage") is None
