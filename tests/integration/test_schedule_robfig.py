"""The schedule parser's ticks (the sidecar's, which the operator uses for missed runs and
`run --schedule` for its tick) against robfig/cron's own (tests/controlplane/go/cronnext,
the version Kubernetes pins, used as the CronJob controller uses it): ~50 schedules from
start times beside daylight-saving changes, month and year ends and a leap day must give
the same ticks, and the same refusals."""

from __future__ import annotations

import datetime
import json
import subprocess
from typing import Any

import pytest

from cronlock_sidecar.lock.schedule import next_tick, ticks_between
from tests.support.tools import gotool

COUNT = 60
YEARS_AHEAD = datetime.timedelta(days=366 * 400)

# (schedule, spec.timeZone)
CASES: list[tuple[str, str | None]] = [
    ("* * * * *", None),
    ("* * * * *", "Europe/Berlin"),
    ("*/7 * * * *", "America/New_York"),
    ("50/5 * * * *", "Europe/Berlin"),
    ("0 * * * *", "Australia/Lord_Howe"),
    ("@hourly", "America/New_York"),
    ("30 2 * * *", "Europe/Berlin"),
    ("30 2 * * *", "America/New_York"),
    ("30 1 * * *", "America/New_York"),
    ("0 2 * * *", "Europe/Berlin"),
    ("15 2,3 * * *", "Europe/Berlin"),
    ("*/20 1-3 * * *", "America/New_York"),
    ("0 0 * * *", "America/Santiago"),
    ("0 0 * * *", "America/Sao_Paulo"),
    ("15 2 * * *", "Australia/Lord_Howe"),
    ("@daily", None),
    ("@midnight", "Asia/Kolkata"),
    ("@weekly", "Europe/Berlin"),
    ("@monthly", "America/New_York"),
    ("@yearly", None),
    ("@annually", "Australia/Lord_Howe"),
    ("0 0 29 2 *", None),
    ("0 0 29 2 *", "Europe/Berlin"),
    ("0 0 30 2 *", None),  # never ticks
    ("59 23 31 2 *", None),  # never ticks
    ("0 0 31 * *", "America/New_York"),
    ("30 23 28-31 * *", None),
    ("0 0 13 * 5", None),  # day-of-month OR day-of-week
    ("0 9 * * mon-fri", "Europe/Berlin"),
    ("0 9-17/2 * * 1-5", "America/New_York"),
    ("30 6-16/4 * * 1-5", None),
    ("0 0 1,15 * 3", None),
    ("0 0 * JAN,jul SUN", None),
    ("5 4 * * sun", "America/New_York"),
    ("0 22 * * 6,0", "Europe/Berlin"),
    ("0 0 ? * ?", None),
    ("0 0 */10 * *", None),
    ("0 12 * feb-apr *", None),
    ("0 0 31 dec *", None),
    ("*-5 * * * *", None),  # robfig reads `*-5` as `*`
    ("0 0 1,,15 * *", None),  # and skips the empty range
    ("0 +3 * * *", None),
    ("CRON_TZ=Europe/Berlin 30 2 * * *", None),
    ("TZ=America/New_York 0 2 * * *", "Europe/Berlin"),  # the schedule's zone wins
    ("TZ=Asia/Kathmandu 0 * * * *", None),
    ("TZ=UTC @every 1h", None),
    ("@every 90m", None),
    ("@every 1h30m10.5s", "Europe/Berlin"),
    ("@every 500ms", None),
    ("@every 1.15m", None),
    # Refused: by the parser, or (an unknown spec.timeZone) by the controller.
    ("not a schedule", None),
    ("* * * *", None),
    ("60 * * * *", None),
    ("@Daily", None),
    ("@every soon", None),
    ("TZ=UTC", None),
    ("TZ=Nowhere/Bogus * * * * *", None),
    ("0 0 * * *", "Nowhere/Bogus"),
]


def utc(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


STARTS = [
    "2026-03-29T00:30:00Z",  # Berlin springs forward at 01:00Z
    "2026-10-25T00:20:00Z",  # Berlin falls back at 01:00Z
    "2026-03-08T06:10:00Z",  # New York springs forward at 07:00Z
    "2026-11-01T05:10:00Z",  # New York falls back at 06:00Z
    "2026-10-03T15:00:00Z",  # Lord Howe: 02:00 becomes 02:30 at 15:30Z
    "2026-09-06T03:30:00Z",  # Santiago: midnight becomes 01:00 at 04:00Z
    "2018-11-04T02:30:00Z",  # Sao Paulo: midnight became 01:00 at 03:00Z
    "2028-02-28T23:59:59.5Z",  # the eve of a leap day, half a second to go
    "2026-01-31T23:30:00Z",  # a month's end
    "2026-12-31T23:00:00Z",  # a year's end
]


@pytest.fixture(scope="module")
def robfig() -> dict[tuple[str, str | None, str], dict[str, Any]]:
    """robfig/cron's answer for every case and start, from one run of cronnext."""
    requests = [
        {"schedule": schedule, "tz": zone, "after": start, "count": COUNT}
        for schedule, zone in CASES
        for start in STARTS
    ]
    ran = subprocess.run(
        [gotool("cronnext")],
        input="".join(json.dumps(request) + "\n" for request in requests),
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    answers = [json.loads(line) for line in ran.stdout.splitlines()]
    assert len(answers) == len(requests)
    return {
        (request["schedule"], request["tz"], request["after"]): answer
        for request, answer in zip(requests, answers, strict=True)
    }


@pytest.mark.parametrize(("schedule", "zone"), CASES)
def test_ticks_match_robfig(
    robfig: dict[tuple[str, str | None, str], dict[str, Any]], schedule: str, zone: str | None
) -> None:
    for start in STARTS:
        answer = robfig[schedule, zone, start]
        after = utc(start)
        # The controller counts @every from the last schedule time; cronnext from `after`.
        ticks = ticks_between(schedule, zone, after, after + YEARS_AHEAD, COUNT, anchor=after)
        following = next_tick(schedule, zone, after, anchor=after)
        if "error" in answer:
            assert ticks is None, (start, answer["error"])
            assert following is None, start
            continue
        expected = [utc(text) for text in answer["ticks"]]
        assert ticks == expected, start
        assert following == (expected[0] if expected else None), start
