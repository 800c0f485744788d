"""tests/reliability/soak.py: soak reports add up, worst cases stay, a broken one fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.soak import combine, main, markdown


def report(
    runs: int, after: float, overlaps: int = 0, recovery: float | None = 1.0
) -> dict[str, Any]:
    return {
        "command": "python -m tests.reliability.pods --nodes 2 --soak 1000",
        "commit": "abc123",
        "started": "2026-12-03T10:00:00Z",
        "finished": False,
        "seed": 7,
        "trials": 2,
        "faults": 2,
        "runs": runs,
        "jobs": runs + 1,
        "overlaps": overlaps,
        "tracker_overlaps": overlaps,
        "works_past_expiry": 0,
        "works_compared_with_expiry": runs,
        "works_without_lease": [],
        "lost_leases": 1,
        "delayed": 0,
        "timed_out_trials": 0,
        "leftover_works": 0,
        "fault_errors": 0,
        "corrupted_cronjobs": 0,
        "max_after_expiry_s": after,
        "runs_by_node": {"cronlock-node": runs - 1, "cronlock-node-2": 1},
        "seconds": 1800.0,
        "by_fault": {
            "preempt": {
                "faults": 2,
                "trials": 2,
                "overlaps": overlaps,
                "tracker_overlaps": overlaps,
                "delayed": 0,
                "lost_leases": 1,
                "corrupted_cronjobs": 0,
                "max_after_expiry_s": after,
                "recovery_max_s": recovery,
                "recovery_s": [recovery, 0.5],
                "errors": [],
            }
        },
    }


def test_reports_add_up_and_keep_the_worst_case() -> None:
    total = combine([report(10, -4.0), report(7, -2.5, recovery=None)])

    assert total["runs"] == 17
    assert total["trials"] == 4
    assert total["lost_leases"] == 2
    assert total["max_after_expiry_s"] == -2.5
    assert total["runs_by_node"] == {"cronlock-node": 15, "cronlock-node-2": 2}
    row = total["by_fault"]["preempt"]
    assert row["faults"] == 4
    assert row["max_after_expiry_s"] == -2.5
    assert row["recovery_max_s"] == 1.0
    assert row["unrecovered"] == 1
    assert [source["runs"] for source in total["sources"]] == [10, 7]
    table = markdown(total)
    assert "| 17 (cronlock-node 15, cronlock-node-2 2) | 4 | 4 | 0 / 0 | -2.5 s |" in table
    assert "| preempt | 4 | 0 / 0 | -2.5 s | 2 | 1.0 s | 1 | 0 |" in table
    assert table.count("cut short") == 2


def test_an_overlap_in_any_report_fails_the_soak(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = []
    for number, body in enumerate([report(10, -4.0), report(5, -3.0, overlaps=1)]):
        path = tmp_path / f"r{number}.json"
        path.write_text(json.dumps(body))
        paths.append(str(path))

    assert main(paths[:1]) == 0
    assert main(paths) == 1
    assert "| 15 (" in capsys.readouterr().out


def test_an_unreadable_report_is_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main([str(bad)]) == 2
