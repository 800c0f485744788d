"""The tick ledger the clusters ring counts by (tests/support/ledger.py): a tick worked
twice or not at all is counted so, whatever cluster's line it was."""

from __future__ import annotations

import datetime
import socket

from tests.support.kube import wait_for
from tests.support.ledger import Entry, TickLedger, disagreements, tally

NOON = datetime.datetime(2026, 12, 6, 12, 0, tzinfo=datetime.UTC)
MINUTES = int(NOON.timestamp() // 60)


def line(minutes: int, cluster: str, tick_file: str = "-", cronjob: str = "nightly") -> Entry:
    return Entry(f"{cronjob}-{minutes}", tick_file, cluster, f"pod-{cluster}", 0.0)


def test_a_tick_worked_by_both_clusters_is_twice_and_a_tick_without_work_is_lost() -> None:
    minute = datetime.timedelta(minutes=1)
    entries = [
        line(MINUTES, "a"),
        line(MINUTES, "b"),
        line(MINUTES + 2, "b"),
        line(MINUTES + 1, "a", cronjob="other"),  # another CronJob's tick: not this one's
        Entry("nightly-manual-1", "-", "a", "p", 0.0),  # a manual run: no tick
    ]
    counted = tally(entries, "nightly", [NOON, NOON + minute, NOON + 2 * minute])
    assert counted.twice == [NOON]
    assert counted.lost == [NOON + minute]
    assert counted.by_cluster() == {"a": 1, "b": 2}
    assert "12:00 a (pod-a, tick file -), b (pod-b, tick file -)" in counted.describe()


def test_a_tick_file_naming_another_tick_than_the_jobs_is_a_disagreement() -> None:
    right = line(MINUTES, "a", "2026-12-06T12:00:00Z")
    wrong = line(MINUTES, "b", "2026-12-06T12:01:00Z")
    assert disagreements([right, wrong, line(MINUTES, "a")], "nightly") == [wrong]


def test_the_ledger_keeps_each_line_a_work_sends_on_every_address() -> None:
    ledger = TickLedger(["127.0.0.1", "127.0.0.2"])
    ledger.start()
    try:
        for address in ("127.0.0.1", "127.0.0.2"):
            with socket.create_connection((address, ledger.port), timeout=5) as client:
                client.sendall(f"nightly-{MINUTES} - {address[-1]} pod\n".encode())
        with socket.create_connection(("127.0.0.1", ledger.port), timeout=5) as client:
            client.sendall(b"garbled\n")
        entries = wait_for(
            lambda: found if len(found := ledger.entries()) == 3 else None, 10, "three lines"
        )
    finally:
        ledger.close()
    assert sorted(entry.cluster for entry in entries) == ["1", "2", "?"]
    assert all(entry.tick("nightly") == NOON for entry in entries if entry.cluster != "?")
