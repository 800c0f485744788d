"""`python -m tests.reliability.soak REPORT.json...`: one table from the pod checker's soak reports.

A soak (`python -m tests.reliability.pods --nodes 2 --soak 1000 --output R.json`) takes
hours of the real nodes; it writes its report after every trial, so a soak cut short (a
session's end) keeps what it ran, and the next soak goes on in a new report. This adds the
reports up, run by run and fault by fault, and prints the Markdown that
docs/RELIABILITY.md's soak section shows: totals, each fault kind, and every report's
command, commit and date. Exit 1 when a report breaks the guarantee
(`tests.reliability.pods.guarantee_held`).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.reliability.pods import guarantee_held

# Counts that add up across reports.
SUMMED = (
    "trials",
    "faults",
    "runs",
    "jobs",
    "completed_runs",
    "stopped_runs",
    "overlaps",
    "tracker_overlaps",
    "refused_stale_writes",
    "works_past_expiry",
    "works_compared_with_expiry",
    "lost_leases",
    "delayed",
    "timed_out_trials",
    "leftover_works",
    "fault_errors",
    "corrupted_cronjobs",
    "seconds",
)
KIND_SUMMED = (
    "faults",
    "trials",
    "overlaps",
    "tracker_overlaps",
    "delayed",
    "lost_leases",
    "corrupted_cronjobs",
)


def _max(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return max(present) if present else None


def combine(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The reports as one: counts summed, worst cases kept, each report's origin listed."""
    total: dict[str, Any] = {key: sum(report.get(key) or 0 for report in reports) for key in SUMMED}
    total["max_after_expiry_s"] = _max([report.get("max_after_expiry_s") for report in reports])
    total["works_without_lease"] = [
        pod for report in reports for pod in report.get("works_without_lease") or []
    ]
    by_node: collections.Counter[str] = collections.Counter()
    for report in reports:
        by_node.update(report.get("runs_by_node") or {})
    total["runs_by_node"] = dict(sorted(by_node.items()))
    kinds = sorted({kind for report in reports for kind in report.get("by_fault") or {}})
    by_fault: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        rows = [
            report["by_fault"][kind] for report in reports if kind in report.get("by_fault", {})
        ]
        row: dict[str, Any] = {key: sum(r.get(key) or 0 for r in rows) for key in KIND_SUMMED}
        row["max_after_expiry_s"] = _max([r.get("max_after_expiry_s") for r in rows])
        row["recovery_max_s"] = _max([r.get("recovery_max_s") for r in rows])
        row["unrecovered"] = sum(
            1 for r in rows for value in r.get("recovery_s") or [] if value is None
        )
        row["errors"] = [error for r in rows for error in r.get("errors") or []]
        by_fault[kind] = row
    total["by_fault"] = by_fault
    total["sources"] = [
        {
            "command": report.get("command", "?"),
            "commit": report.get("commit", "?"),
            "started": report.get("started", "?"),
            "seed": report.get("seed"),
            "trials": report.get("trials", 0),
            "runs": report.get("runs", 0),
            "seconds": report.get("seconds", 0),
            "finished": report.get("finished", False),
        }
        for report in reports
    ]
    return total


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f} s"


def markdown(total: Mapping[str, Any]) -> str:
    """The combined figures as docs/RELIABILITY.md shows them."""
    hours = total["seconds"] / 3600
    nodes = ", ".join(f"{name} {runs}" for name, runs in total["runs_by_node"].items()) or "-"
    lines = [
        "| runs (works) | faults | trials | overlaps (flock / tracker) "
        "| max work stop - Lease expiry "
        "| works past expiry | holds lost | fault errors | corrupted CronJobs | node time |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {total['runs']} ({nodes}) | {total['faults']} | {total['trials']} "
        f"| {total['overlaps']} / {total['tracker_overlaps']} "
        f"| {_seconds(total['max_after_expiry_s'])} | {total['works_past_expiry']} "
        f"of {total['works_compared_with_expiry']} | {total['lost_leases']} "
        f"| {total['fault_errors']} | {total['corrupted_cronjobs']} | {hours:.1f} h |",
        "",
        "| fault | times | overlaps in its trials | max work stop - Lease expiry | holds lost "
        "| slowest recovery | not recovered | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind, row in total["by_fault"].items():
        recovery = "-" if row["recovery_max_s"] is None else f"{row['recovery_max_s']:.1f} s"
        lines.append(
            f"| {kind} | {row['faults']} | {row['overlaps']} / {row['tracker_overlaps']} "
            f"| {_seconds(row['max_after_expiry_s'])} | {row['lost_leases']} | {recovery} "
            f"| {row['unrecovered']} | {len(row['errors'])} |"
        )
    lines += ["", "| report | command | commit | started (UTC) | trials | runs | finished |"]
    lines.append("|---|---|---|---|---|---|---|")
    for number, source in enumerate(total["sources"], 1):
        lines.append(
            f"| {number} | `{source['command']}` | {source['commit']} | {source['started']} "
            f"| {source['trials']} | {source['runs']} "
            f"| {'yes' if source['finished'] else 'cut short'} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.reliability.soak", description=__doc__.splitlines()[0]
    )
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--json", action="store_true", help="print the combined JSON instead")
    args = parser.parse_args(argv)
    try:
        reports = [json.loads(path.read_text()) for path in args.reports]
    except (OSError, json.JSONDecodeError) as error:
        print(f"soak: cannot read a report: {error}", file=sys.stderr)
        return 2
    total = combine(reports)
    print(json.dumps(total, indent=2) if args.json else markdown(total))
    return 0 if guarantee_held(total) else 1


if __name__ == "__main__":
    sys.exit(main())
