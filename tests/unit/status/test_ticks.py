"""`cronlock status` shows each lock's record of the last tick per CronJob (issue 56):
from the Lease's (or store document's) `cronlock.io/tick.<cronjob>` annotations, in every
output format; a value that does not read as a record is no record and breaks nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
import yaml

from cronlock_operator.cronjob.reading import Readings
from cronlock_operator.status.model import rows
from cronlock_operator.status.render import (
    as_list,
    render_json,
    render_table,
    render_yaml,
    succeeded_text,
    tick_text,
)
from cronlock_sidecar.lock.ticks import TickRecord
from tests.unit.status.objects import NOW, cronjob, lease

MINE = "2026-11-29T07:55:00Z report-29405875 uid-a report-29405875-x9k2p_0a1b east"
THEIRS = "2026-11-29T07:50:00Z - vm-run-7 vm-01 -"
HOSTILE = {
    "cronlock.io/tick.broken": "2026-11-29T07:55:00Z \x1b]0;owned\x07 a b c",
    "cronlock.io/tick.six": "2026-11-29T07:55:00Z a b c d e",
    "cronlock.io/tick.nottime": "yesterday a b c d",
    "cronlock.io/tick.feb30": "2026-02-30T00:00:00Z a b c d",
}


def test_the_rows_carry_every_readable_record_on_the_lock_and_their_own() -> None:
    (row,) = rows(
        [cronjob("report")],
        [
            lease(
                "report",
                annotations={
                    "cronlock.io/tick.report": MINE,
                    "cronlock.io/tick.vm-job": THEIRS,
                    **HOSTILE,
                },
            )
        ],
        NOW,
        readings=Readings(),
    )
    assert row.ticks == (
        TickRecord(
            "report",
            datetime(2026, 11, 29, 7, 55, tzinfo=UTC),
            "report-29405875",
            "uid-a",
            "report-29405875-x9k2p_0a1b",
            "east",
        ),
        TickRecord(
            "vm-job", datetime(2026, 11, 29, 7, 50, tzinfo=UTC), "", "vm-run-7", "vm-01", ""
        ),
    )
    assert row.last_tick == row.ticks[0]
    assert tick_text(row) == (
        "2026-11-29T07:55:00Z job report-29405875 (run uid-a, holder "
        "report-29405875-x9k2p_0a1b, cluster east)"
    )


def test_a_lock_without_records_or_with_only_hostile_ones_shows_none() -> None:
    for notes in ({}, HOSTILE):
        (row,) = rows(
            [cronjob("report")], [lease("report", annotations=notes)], NOW, readings=Readings()
        )
        assert row.ticks == ()
        assert tick_text(row) == "-"
    # No Lease at all.
    (row,) = rows([cronjob("report")], [], NOW, readings=Readings())
    assert row.ticks == ()


def test_wide_shows_the_last_tick_and_json_and_yaml_every_record_with_every_field() -> None:
    status_rows = rows(
        [cronjob("report")],
        [
            lease(
                "report",
                annotations={"cronlock.io/tick.report": MINE, "cronlock.io/tick.vm-job": THEIRS},
            )
        ],
        NOW,
        readings=Readings(),
    )
    table = render_table(status_rows, 400, wide=True)
    header, line = table.splitlines()
    assert "LAST TICK" in header
    assert (
        "2026-11-29T07:55:00Z job report-29405875 (run uid-a, holder report-29405875-x9k2p_0a1b, "
        "cluster east)"
    ) in line
    expected = [
        {
            "cronjob": "report",
            "tick": "2026-11-29T07:55:00Z",
            "job": "report-29405875",
            "run": "uid-a",
            "holder": "report-29405875-x9k2p_0a1b",
            "cluster": "east",
        },
        {
            "cronjob": "vm-job",
            "tick": "2026-11-29T07:50:00Z",
            "job": None,
            "run": "vm-run-7",
            "holder": "vm-01",
            "cluster": None,
        },
    ]
    assert json.loads(render_json(status_rows))["items"][0]["ticks"] == expected
    assert yaml.safe_load(render_yaml(status_rows))["items"][0]["ticks"] == expected
    assert as_list(status_rows)["items"][0]["ticks"] == expected


@pytest.mark.parametrize("value", [["not", "a", "mapping"], "text", 7])
def test_a_lock_document_whose_annotations_are_no_mapping_shows_no_records(
    value: object,
) -> None:
    """A store document is whatever was written to the store (status/stores.py)."""
    document = lease("report")
    document["metadata"]["annotations"] = value
    (row,) = rows([cronjob("report")], [document], NOW, readings=Readings())
    assert row.ticks == ()


def test_a_lock_in_a_store_shows_the_records_of_its_document_as_read() -> None:
    """With --read-stores, the store's document (status/stores.py) is the lock's: its
    records are shown as a Lease's; unread, the row has none."""
    body = cronjob("ledger")
    body["metadata"]["annotations"].update(
        {"cronlock.io/store": "redis", "cronlock.io/store-secret": "team-locks"}
    )
    document = lease(
        "ledger", annotations={"cronlock.io/tick.ledger": MINE.replace("report", "ledger")}
    )
    (unread,) = rows([body], [], NOW, readings=Readings())
    assert unread.state == "in-store"
    assert unread.ticks == ()
    (row,) = rows(
        [body], [], NOW, stored={("default", "cronlock-ledger"): document}, readings=Readings()
    )
    assert row.last_tick is not None
    assert (row.last_tick.job, row.last_tick.cluster) == ("ledger-29405875", "east")


def test_the_last_successful_tick_is_shown_beside_the_last_claimed_one() -> None:
    """The 07:55 tick was claimed (and failed); 07:50 is the last whose run succeeded."""
    succeeded = "2026-11-29T07:50:00Z report-29405870 uid-z report-29405870-a1b2c_0a1b east"
    notes = {
        "cronlock.io/tick.report": MINE,
        "cronlock.io/succeeded.report": succeeded,
        "cronlock.io/succeeded.broken": "2026-11-29T07:55:00Z a b c",
    }
    status_rows = rows(
        [cronjob("report")], [lease("report", annotations=notes)], NOW, readings=Readings()
    )
    (row,) = status_rows
    assert row.last_tick is not None
    assert succeeded_text(row) == "2026-11-29T07:50:00Z"
    header, line = render_table(status_rows, 500, wide=True).splitlines()
    assert "LAST SUCCESSFUL TICK" in header
    assert line.split()[-2:] == ["2026-11-29T07:50:00Z", "-"], line  # then FROZEN
    expected = [
        {
            "cronjob": "report",
            "tick": "2026-11-29T07:50:00Z",
            "job": "report-29405870",
            "run": "uid-z",
            "holder": "report-29405870-a1b2c_0a1b",
            "cluster": "east",
        }
    ]
    item = json.loads(render_json(status_rows))["items"][0]
    assert item["successes"] == expected
    assert item["ticks"][0]["tick"] == "2026-11-29T07:55:00Z"
    assert yaml.safe_load(render_yaml(status_rows))["items"][0]["successes"] == expected
    # none recorded: `-` and an empty list
    (bare,) = rows([cronjob("report")], [lease("report", annotations={})], NOW, readings=Readings())
    assert succeeded_text(bare) == "-"
    assert as_list([bare])["items"][0]["successes"] == []
