"""Schedule ticks as the CronJob controller finds them, and the shortest gap between two."""

from __future__ import annotations

import datetime
import time

import pytest

from cronlock_sidecar.lock.schedule import min_gap_seconds, next_tick, ticks_between

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


def utc(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC)


def ticks(
    schedule: str,
    after: str,
    until: str,
    zone: str | None = None,
    limit: int = 100,
    anchor: str | None = None,
) -> list[str] | None:
    found = ticks_between(
        schedule, zone, utc(after), utc(until), limit, None if anchor is None else utc(anchor)
    )
    return None if found is None else [tick.strftime("%Y-%m-%d %H:%M:%S") for tick in found]


@pytest.mark.parametrize(
    ("schedule", "after", "until", "expected"),
    [
        ("*/15 * * * *", "2026-05-04 09:50", "2026-05-04 10:30", ["10:00", "10:15", "10:30"]),
        ("50/5 9 * * *", "2026-05-04 09:00", "2026-05-04 12:00", ["09:50", "09:55"]),
        ("0 9-17/4 * * *", "2026-05-04 00:00", "2026-05-04 23:59", ["09:00", "13:00", "17:00"]),
        ("0 0,12 * * *", "2026-05-04 00:00", "2026-05-05 00:00", ["12:00", "00:00"]),
        ("@hourly", "2026-05-04 09:00", "2026-05-04 11:00", ["10:00", "11:00"]),
        ("30 8 * * ?", "2026-05-04 08:30", "2026-05-05 08:30", ["08:30"]),  # after < T <= until
        ("*-5 7 * * *", "2026-05-04 07:57:30", "2026-05-04 08:00", ["07:58", "07:59"]),
    ],
)
def test_ticks_within_a_day(schedule: str, after: str, until: str, expected: list[str]) -> None:
    found = ticks(schedule, after, until)
    assert found is not None
    assert [tick[11:16] for tick in found] == expected


@pytest.mark.parametrize(
    ("schedule", "after", "expected"),
    [
        ("@daily", "2026-05-04 10:00", "2026-05-05 00:00:00"),
        ("@midnight", "2026-05-04 10:00", "2026-05-05 00:00:00"),
        ("@weekly", "2026-05-04 10:00", "2026-05-10 00:00:00"),  # Sunday
        ("@monthly", "2026-05-04 10:00", "2026-06-01 00:00:00"),
        ("@yearly", "2026-05-04 10:00", "2027-01-01 00:00:00"),
        ("@annually", "2026-12-31 23:59:59.5", "2027-01-01 00:00:00"),
        ("0 12 * JAN,jul MON", "2026-05-04 10:00", "2026-07-06 12:00:00"),
        ("0 9 * * mon-FRI", "2026-05-08 10:00", "2026-05-11 09:00:00"),  # Friday to Monday
        ("0 0 13 * 5", "2026-03-01 00:00", "2026-03-06 00:00:00"),  # Friday the 6th: OR
        ("0 0 13 * *", "2026-03-01 00:00", "2026-03-13 00:00:00"),  # `*` weekday: AND
        ("0 0 31 * *", "2026-04-01 00:00", "2026-05-31 00:00:00"),  # April has no 31st
        ("0 0 29 2 *", "2026-03-01 00:00", "2028-02-29 00:00:00"),
        ("59 23 28-31 2 *", "2028-02-28 23:59", "2028-02-29 23:59:00"),
    ],
)
def test_next_tick(schedule: str, after: str, expected: str) -> None:
    found = next_tick(schedule, None, utc(after))
    assert found == utc(expected)
    assert found.tzinfo == datetime.UTC


def test_a_schedule_that_never_ticks_has_no_ticks_and_no_next_tick() -> None:
    assert ticks("0 0 30 2 *", "2026-01-01", "2036-01-01") == []
    assert next_tick("0 0 30 2 *", None, utc("2026-01-01")) is None
    assert next_tick("0 0 31 4,6 *", "Europe/Berlin", utc("2026-01-01")) is None


def test_limit_keeps_the_earliest_ticks() -> None:
    assert ticks("* * * * *", "2026-05-04 10:00", "2026-05-05 10:00", limit=3) == [
        "2026-05-04 10:01:00",
        "2026-05-04 10:02:00",
        "2026-05-04 10:03:00",
    ]
    assert ticks("* * * * *", "2026-05-04 10:00", "2026-05-05 10:00", limit=0) == []
    assert ticks("* * * * *", "2026-05-04 10:00", "2026-05-04 09:00") == []


def test_time_zone_from_the_spec_or_the_schedule() -> None:
    berlin = ["2026-07-01 07:00:00"]  # 09:00 CEST
    assert ticks("0 9 * * *", "2026-07-01", "2026-07-02", zone="Europe/Berlin") == berlin
    assert ticks("CRON_TZ=Europe/Berlin 0 9 * * *", "2026-07-01", "2026-07-02") == berlin
    assert ticks("TZ=Europe/Berlin 0 9 * * *", "2026-07-01", "2026-07-02") == berlin
    # The controller leaves a schedule that names a zone alone, whatever spec.timeZone says.
    assert ticks("TZ=Europe/Berlin 0 9 * * *", "2026-07-01", "2026-07-02", zone="Asia/Tokyo") == (
        berlin
    )
    assert ticks("0 9 * * *", "2026-07-01", "2026-07-02") == ["2026-07-01 09:00:00"]
    assert ticks("0 9 * * *", "2026-07-01", "2026-07-02", zone="UTC") == ["2026-07-01 09:00:00"]


@pytest.mark.parametrize(
    ("schedule", "zone", "after", "until", "expected"),
    [
        # Spring forward: 02:00-03:00 does not exist; robfig skips that day's 02:30.
        (
            "30 2 * * *",
            "Europe/Berlin",
            "2026-03-28 00:00",
            "2026-03-31 00:00",
            ["2026-03-28 01:30:00", "2026-03-30 00:30:00"],
        ),
        (
            "30 2 * * *",
            "America/New_York",
            "2026-03-07 00:00",
            "2026-03-10 00:00",
            ["2026-03-07 07:30:00", "2026-03-09 06:30:00"],
        ),
        # and an hourly schedule has one tick fewer.
        (
            "0 * * * *",
            "Europe/Berlin",
            "2026-03-28 23:30",
            "2026-03-29 02:30",
            ["2026-03-29 00:00:00", "2026-03-29 01:00:00", "2026-03-29 02:00:00"],
        ),
        # Fall back: 02:00-03:00 (Berlin), 01:00-02:00 (New York) comes twice; so does the run.
        (
            "30 2 * * *",
            "Europe/Berlin",
            "2026-10-24 12:00",
            "2026-10-26 12:00",
            ["2026-10-25 00:30:00", "2026-10-25 01:30:00", "2026-10-26 01:30:00"],
        ),
        (
            "30 1 * * *",
            "America/New_York",
            "2026-10-31 12:00",
            "2026-11-02 12:00",
            ["2026-11-01 05:30:00", "2026-11-01 06:30:00", "2026-11-02 06:30:00"],
        ),
        (
            "0 0-4 * * *",
            "America/New_York",
            "2026-11-01 03:30",
            "2026-11-01 10:00",
            [
                "2026-11-01 04:00:00",  # 00:00 EDT
                "2026-11-01 05:00:00",  # 01:00 EDT
                "2026-11-01 06:00:00",  # 01:00 EST
                "2026-11-01 07:00:00",  # 02:00 EST
                "2026-11-01 08:00:00",
                "2026-11-01 09:00:00",
            ],
        ),
        # Times away from the change keep their wall-clock time.
        (
            "0 9 * * *",
            "America/New_York",
            "2026-03-07 00:00",
            "2026-03-09 00:00",
            ["2026-03-07 14:00:00", "2026-03-08 13:00:00"],
        ),
    ],
)
def test_daylight_saving_days(
    schedule: str, zone: str, after: str, until: str, expected: list[str]
) -> None:
    assert ticks(schedule, after, until, zone=zone) == expected


def test_every_counts_from_the_anchor() -> None:
    anchor = "2026-05-04 10:00:00.700"  # robfig drops the fraction of a second
    assert ticks("@every 90m", "2026-05-04 11:00", "2026-05-04 16:00", anchor=anchor) == [
        "2026-05-04 11:30:00",
        "2026-05-04 13:00:00",
        "2026-05-04 14:30:00",
        "2026-05-04 16:00:00",
    ]
    # The first tick is a whole delay after the anchor, even when asked from before it.
    assert ticks("@every 1h", "2026-05-04 08:00", "2026-05-04 11:30", anchor=anchor) == [
        "2026-05-04 11:00:00"
    ]
    # Delays are cut to whole seconds, at least one; the zone plays no part.
    assert ticks("@every 1.9s", "2026-05-04 10:00", "2026-05-04 10:00:03", anchor=anchor) == [
        "2026-05-04 10:00:01",
        "2026-05-04 10:00:02",
        "2026-05-04 10:00:03",
    ]
    assert ticks(
        "@every 500ms", "2026-05-04 10:00", "2026-05-04 10:00:02", "Europe/Berlin", anchor=anchor
    ) == ["2026-05-04 10:00:01", "2026-05-04 10:00:02"]
    assert next_tick("@every 2h", None, utc("2026-05-04 12:00"), utc(anchor)) == utc(
        "2026-05-04 14:00"
    )


def test_every_without_an_anchor_has_no_ticks() -> None:
    assert ticks("@every 1h", "2026-05-04", "2026-05-05") is None
    assert next_tick("@every 1h", None, utc("2026-05-04")) is None


@pytest.mark.parametrize(
    ("schedule", "zone"),
    [
        ("", None),
        ("not a schedule", None),
        ("* * * *", None),
        ("* * * * * *", None),
        ("60 * * * *", None),
        ("* * 0 * *", None),
        ("* * * * 7", None),
        ("5-1 * * * *", None),
        ("*/0 * * * *", None),
        ("1/2/3 * * * *", None),
        ("-1 * * * *", None),
        ("* * * FOO *", None),
        ("@fortnightly", None),
        ("@Daily", None),  # robfig's descriptors are lower case
        (" @daily", None),
        ("@every soon", None),
        ("@every 1h ", None),
        ("TZ=UTC", None),  # robfig panics; the controller reports it unparseable
        ("TZ=Mars/Olympus_Mons 0 9 * * *", None),
        ("CRON_TZ=../etc/passwd 0 9 * * *", None),
        ("0 9 * * *", "Mars/Olympus_Mons"),  # the controller starts nothing
        ("0 9 * * *", "America"),
    ],
)
def test_bad_schedule_or_zone_has_no_ticks(schedule: str, zone: str | None) -> None:
    assert ticks(schedule, "2026-05-04", "2026-05-05", zone=zone, anchor="2026-05-04") is None
    assert next_tick(schedule, zone, utc("2026-05-04"), utc("2026-05-04")) is None


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(ValueError, match="no time zone"):
        next_tick("@daily", None, datetime.datetime(2026, 5, 4))


def test_a_day_of_minutes_and_a_yearly_tick_are_quick() -> None:
    """Bounds ten times what was measured, far below a minute-by-minute scan's seconds."""
    started = time.perf_counter()
    found = ticks_between("* * * * *", "Europe/Berlin", utc("2026-03-29"), utc("2026-03-30"), 5000)
    minutely = time.perf_counter() - started
    started = time.perf_counter()
    yearly = next_tick("0 0 29 2 *", "America/New_York", utc("2028-03-01"))
    leap_day = time.perf_counter() - started
    assert found is not None
    assert len(found) == 1440
    assert yearly == utc("2032-02-29 05:00")
    assert minutely < 0.25
    assert leap_day < 0.05
