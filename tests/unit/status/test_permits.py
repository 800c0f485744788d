"""`cronlock status` on a lock of N permits (cronlock.io/permits): a row per held permit."""

from __future__ import annotations

import json
from typing import Any

from cronlock_operator.cronjob.reading import Readings
from cronlock_operator.status.model import exit_code, rows
from cronlock_operator.status.render import lock_text, render_json, render_table
from cronlock_sidecar.lock import permits
from cronlock_sidecar.lock.model import Timing
from tests.unit.status.objects import NOW, ago, cronjob, lease


def reports_lock(*holders: tuple[int, str, float], count: int = 3) -> dict[str, Any]:
    """Lock `reports` of `count` permits, each (permit, holder, renewed seconds ago) held;
    permit 0 through the spec, the others as their entries."""
    spec = next((hold for hold in holders if hold[0] == 0), None)
    body = lease(
        "reports",
        holder=spec[1] if spec else "",
        renewed_ago=spec[2] if spec else None,
        duration=30,
        annotations={"cronlock.io/permits": str(count)},
    )
    for number, holder, renewed in holders:
        if number:
            body = permits.claimed_permit(
                body, number, holder, Timing.of(30), ago(renewed), "report-1"
            )
    return body


def test_each_held_permit_is_a_row_with_its_own_holder_and_expiry() -> None:
    jobs = [cronjob("report", lock="reports"), cronjob("export", lock="reports")]
    lock = reports_lock((0, "report-1-aaaaa_1111", 4), (2, "export-9-bbbbb_2222", 10))
    shown = rows(jobs, [lock], NOW, readings=Readings())
    assert [(row.cronjob, row.permit, row.holder, row.state) for row in shown] == [
        ("export", 0, "report-1-aaaaa_1111", "held"),
        ("export", 2, "export-9-bbbbb_2222", "held"),
        ("report", 0, "report-1-aaaaa_1111", "held"),
        ("report", 2, "export-9-bbbbb_2222", "held"),
    ]
    assert [round(row.expires_in_seconds or 0) for row in shown[:2]] == [26, 20]
    assert [lock_text(row) for row in shown[:2]] == ["reports#0", "reports#2"]
    assert exit_code(shown) == 0
    table = render_table(shown, 200)
    assert "reports#2" in table.splitlines()[2]
    assert "export-9-bbbbb_2222" in table.splitlines()[2]
    items = json.loads(render_json(shown))["items"]
    assert [(item["permits"], item["permit"], item["holder"]) for item in items[:2]] == [
        (3, 0, "report-1-aaaaa_1111"),
        (3, 2, "export-9-bbbbb_2222"),
    ]


def test_a_lock_of_permits_none_held_is_one_free_row_and_of_one_permit_as_always() -> None:
    [free] = rows([cronjob("report", lock="reports")], [reports_lock()], NOW, readings=Readings())
    assert (free.state, free.holder, free.permits, lock_text(free)) == (
        "free",
        None,
        3,
        "reports#0",
    )
    # Only entry 1 held: its row alone, the spec's free permit shows none.
    [entry] = rows(
        [cronjob("report", lock="reports")],
        [reports_lock((1, "report-1-aaaaa_1111", 5))],
        NOW,
        readings=Readings(),
    )
    assert (entry.permit, entry.holder) == (1, "report-1-aaaaa_1111")
    # One permit: the one row of today.
    [one] = rows(
        [cronjob("report")],
        [lease("report", holder="report-1-aaaaa_1111", renewed_ago=4)],
        NOW,
        readings=Readings(),
    )
    assert (one.permits, lock_text(one)) == (1, "report")


def test_an_expired_permit_is_a_problem_on_its_own_row_and_the_cronjobs_said_once() -> None:
    job = cronjob("report", lock="reports", skips=5, alert_after="3")
    lock = reports_lock((1, "report-1-aaaaa_1111", 4), (2, "gone-1-ccccc_3333", 90))
    first, second = rows([job], [lock], NOW, readings=Readings())
    assert (first.permit, first.state, second.permit, second.state) == (1, "held", 2, "expired")
    assert first.problems == ("cronjob default/report skipped 5 consecutive runs (alert-after 3)",)
    assert second.problems == (
        "lease default/cronlock-reports permit 2 expired 60s ago but is still held by "
        "gone-1-ccccc_3333",
    )
    assert exit_code([first, second]) == 1
