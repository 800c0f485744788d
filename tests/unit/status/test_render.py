"""How the status table fits a terminal and what the JSON output promises to scripts."""

from __future__ import annotations

import json
from datetime import timedelta

import yaml

from cronlock_operator.cronjob.reading import Readings
from cronlock_operator.status.model import StatusRow, rows
from cronlock_operator.status.render import json_row, render_json, render_table, render_yaml
from tests.unit.status.objects import NOW, cronjob, lease

LONG_HOLDER = "nightly-report-export-29123456-x7k2p_4f0e9a1c-2b3d-4e5f-8a9b-0c1d2e3f4a5b"


def sample() -> list[StatusRow]:
    return rows(
        [
            cronjob("nightly-report-export", "analytics", skips=1, last_schedule_ago=65),
            cronjob("cleanup", "analytics", last_schedule_ago=3 * 3600),
            cronjob("stuck", "ops", skips=4, last_schedule_ago=600),
            cronjob("new", "ops"),
        ],
        [
            lease("nightly-report-export", "analytics", holder=LONG_HOLDER, renewed_ago=4),
            lease("cleanup", "analytics", holder="", renewed_ago=900),
            lease("stuck", "ops", holder="stuck-29-q1w2e_77aa", renewed_ago=7200, duration=60),
        ],
        NOW,
        readings=Readings(),
    )


def table(text: str) -> list[list[str]]:
    """Split on runs of 2+ spaces: the table's column gap; single spaces stay in cells."""
    return [[cell for cell in line.split("  ") if cell.strip()] for line in text.splitlines()]


def cells(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line] for line in table(text)]


def test_a_wide_terminal_gets_every_column_untruncated() -> None:
    text = render_table(sample(), 200)

    header, *body = cells(text)
    assert header == [
        "CRONJOB",
        "LOCK",
        "HOLDER",
        "RENEWED",
        "EXPIRES",
        "SKIPS",
        "LAST SCHEDULE",
        "LAST SUCCESS",
        "NEXT",
    ]
    assert body == [
        ["cleanup", "cleanup", "-", "15m ago", "-", "0", "3h ago", "-", "in 5m"],
        [
            "nightly-report-export",
            "nightly-report-export",
            LONG_HOLDER,
            "4s ago",
            "in 26s",
            "1",
            "65s ago",
            "-",
            "in 5m",
        ],
        ["new", "new", "missing", "-", "-", "0", "-", "-", "in 5m"],
        [
            *("stuck", "stuck", "stuck-29-q1w2e_77aa", "120m ago", "expired 119m ago", "4"),
            *("10m ago", "-", "in 5m"),
        ],
    ]
    assert "…" not in text


def test_columns_line_up_under_their_headers() -> None:
    header, *body = render_table(sample(), 200).splitlines()

    start = header.index("EXPIRES")
    for line in body:
        assert line[start - 1] == " "
        assert line[start] != " "


def test_namespace_is_a_column_only_across_all_namespaces() -> None:
    assert cells(render_table(sample(), 200))[0][0] == "CRONJOB"

    header, first, *_ = cells(render_table(sample(), 200, all_namespaces=True))

    assert header[0] == "NAMESPACE"
    assert first[:2] == ["analytics", "cleanup"]


def test_on_an_80_column_terminal_the_holder_is_truncated_and_lines_fit() -> None:
    text = render_table(sample(), 80)

    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), text
    assert "…" in text
    header, _, held, *_ = cells(text)
    holder = held[header.index("HOLDER")]
    assert holder.endswith("…")
    assert LONG_HOLDER.startswith(holder[:-1])
    assert len(holder) >= 16
    # Every lock is the CronJob's name here, so LOCK goes first, then LAST SCHEDULE.
    assert header == ["CRONJOB", "HOLDER", "RENEWED", "EXPIRES", "SKIPS"]


def test_a_lock_shared_under_another_name_keeps_its_column_longer() -> None:
    shared = [
        *sample(),
        *rows(
            [cronjob("import", "analytics", lock="warehouse")],
            [lease("warehouse", "analytics", holder="import-1-bbbbb_0002", renewed_ago=2)],
            NOW,
            readings=Readings(),
        ),
    ]

    text = render_table(shared, 100)

    assert all(len(line) <= 100 for line in text.splitlines()), text
    assert cells(text)[0] == ["CRONJOB", "LOCK", "HOLDER", "EXPIRES", "SKIPS"]
    assert cells(text)[-1][:2] == ["import", "warehouse"]


def test_a_narrow_terminal_drops_the_least_useful_columns_first() -> None:
    text = render_table(sample(), 70, all_namespaces=True)

    header = cells(text)[0]
    assert all(len(line) <= 70 for line in text.splitlines()), text
    assert "LAST SCHEDULE" not in header
    assert header[:2] == ["NAMESPACE", "CRONJOB"]
    assert {"HOLDER", "EXPIRES"} <= set(header)


def test_a_very_narrow_terminal_still_shows_who_holds_what_and_until_when() -> None:
    text = render_table(sample(), 50)

    header, *body = cells(text)
    assert header == ["CRONJOB", "HOLDER", "EXPIRES"]
    assert all(len(line) <= 50 for line in text.splitlines()), text
    assert body[3][-1] == "expired 119m ago"


def test_nothing_is_dropped_when_the_table_fits_even_on_a_narrow_terminal() -> None:
    small = rows(
        [cronjob("a")], [lease("a", holder="a-1_2", renewed_ago=1)], NOW, readings=Readings()
    )

    assert len(cells(render_table(small, 70))[0]) == 7


def test_wide_output_adds_state_ttl_alert_after_and_the_last_release() -> None:
    released = rows(
        [cronjob("cleanup")],
        [
            lease(
                "cleanup",
                holder="",
                renewed_ago=900,
                annotations={
                    "cronlock.io/last-holder": "cleanup-1-aaaaa_0001",
                    "cronlock.io/released-at": "2026-11-29T07:45:00.500000Z",
                },
            )
        ],
        NOW,
        readings=Readings(),
    )

    header, row = cells(render_table(released, 60, wide=True))

    assert header == [
        "CRONJOB",
        "LOCK",
        "HOLDER",
        "RENEWED",
        "EXPIRES",
        "SKIPS",
        "LAST SCHEDULE",
        "LAST SUCCESS",
        "NEXT",
        "STATE",
        "GUARDED BY",
        "STORE",
        "POLICY",
        "TTL",
        "ALERT AFTER",
        "SUSPEND",
        "LAST HOLDER",
        "RELEASED",
        "LAST TICK",
        "LAST SUCCESSFUL TICK",
        "FROZEN",
    ]
    assert row[9:] == [
        *("free", "annotation", "lease", "skip", "30s", "3", "false", "cleanup-1-aaaaa_0001"),
        *("15m ago", "-", "-", "-"),
    ]


def test_a_frozen_lock_shows_until_when_and_by_whom_until_its_freeze_ends() -> None:
    freeze = {
        "cronlock.io/frozen-until": "2026-11-29T09:00:00.000000Z",
        "cronlock.io/frozen-by": "alice",
        "cronlock.io/frozen-reason": "DB migration",
    }
    frozen = rows(
        [cronjob("cleanup")],
        [lease("cleanup", holder="", annotations=freeze)],
        NOW,
        readings=Readings(),
    )
    _, row = cells(render_table(frozen, 200, wide=True))
    assert row[-1] == "until 2026-11-29T09:00:00Z by alice"
    [item] = json.loads(render_json(frozen))["items"]
    assert item["frozen"] == {
        "until": "2026-11-29T09:00:00Z",
        "by": "alice",
        "reason": "DB migration",
    }
    # Past its time, the freeze is over: nothing shown.
    later = rows(
        [cronjob("cleanup")],
        [lease("cleanup", holder="", annotations=freeze)],
        NOW + timedelta(hours=2),
        readings=Readings(),
    )
    assert json.loads(render_json(later))["items"][0]["frozen"] is None


def test_json_is_a_list_of_objects_with_iso_times_and_numeric_seconds() -> None:
    document = json.loads(render_json(sample()))

    assert (document["apiVersion"], document["kind"], document["metadata"]) == ("v1", "List", {})
    by_name = {entry["cronjob"]: entry for entry in document["items"]}
    held = by_name["nightly-report-export"]
    assert held == {
        "namespace": "analytics",
        "cronjob": "nightly-report-export",
        "lock": "nightly-report-export",
        "lease": "cronlock-nightly-report-export",
        "store": "lease",
        "guardedBy": "annotation",
        "policy": "skip",
        "state": "held",
        "permits": 1,
        "permit": 0,
        "holder": LONG_HOLDER,
        "renewTime": "2026-11-29T07:59:56Z",
        "renewedSecondsAgo": 4.0,
        "expireTime": "2026-11-29T08:00:26Z",
        "expiresInSeconds": 26.0,
        "leaseDurationSeconds": 30,
        "consecutiveSkips": 1,
        "alertAfter": 3,
        "lastScheduleTime": "2026-11-29T07:58:55Z",
        "lastScheduleSecondsAgo": 65.0,
        "lastHolder": None,
        "releasedAt": None,
        "suspend": False,
        "lastSuccessfulTime": None,
        "nextScheduleTime": "2026-11-29T08:05:00Z",
        "frozen": None,
        "ticks": [],
        "successes": [],
        "problems": [],
    }
    stuck = by_name["stuck"]
    assert stuck["state"] == "expired"
    assert stuck["expiresInSeconds"] == -7140.0
    assert len(stuck["problems"]) == 2
    free = by_name["cleanup"]
    assert (free["state"], free["holder"], free["expireTime"], free["expiresInSeconds"]) == (
        "free",
        None,
        None,
        None,
    )
    missing = by_name["new"]
    assert (missing["state"], missing["renewTime"], missing["lastScheduleTime"]) == (
        "missing",
        None,
        None,
    )


def test_json_of_nothing_is_an_empty_list() -> None:
    assert json.loads(render_json([])) == {
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {},
        "items": [],
    }


def test_yaml_is_the_same_list() -> None:
    assert yaml.safe_load(render_yaml(sample())) == json.loads(render_json(sample()))


def test_a_lock_in_redis_shows_its_store_not_a_missing_lease() -> None:
    """No Lease here for a lock in Redis or PostgreSQL: not "missing", but where it is."""
    shared = cronjob("ledger")
    shared["metadata"]["annotations"].update(
        {"cronlock.io/store": "redis", "cronlock.io/store-secret": "team-locks"}
    )
    (row,) = rows([shared], [], NOW, readings=Readings())
    assert (row.state, row.store, row.problems) == ("in-store", "redis", ())
    header, cells_ = cells(render_table([row], 200, wide=True))
    shown = dict(zip(header, cells_, strict=True))
    assert (shown["HOLDER"], shown["STATE"], shown["STORE"]) == ("(in redis)", "in-store", "redis")
    assert json_row(row)["store"] == "redis"
