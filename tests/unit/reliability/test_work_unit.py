"""The checkers' work unit (tests/reliability/work_unit.py) and the tracker's count of works
alive at once (tests/support/node.py `crowded`), for one holder and for N permits."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability.work_unit import work_script
from tests.support.node import Work, crowded, overlapping

PRELUDE = """
import fcntl, json, os, sys, time
lock_path, store_path, events_path, seconds, token = sys.argv[1:6]
token = int(token)
{extra}
def record(event, **fields):
    with open(events_path, "a") as out:
        line = {{"event": event, "pid": os.getpid(), "token": token, **fields}}
        out.write(json.dumps(line) + "\\n")
"""


def start_units(
    tmp_path: Path, tokens: list[int], *, slots: int | None = None, permits: list[int] | None = None
) -> list[dict[str, object]]:
    """Start one unit per token at once, each working 1.5 s; their events once all ended."""
    units = []
    for index, token in enumerate(tokens):
        extra = "" if slots is None else f"slots = {slots}\npermit = {(permits or [0] * 9)[index]}"
        script = work_script(PRELUDE.format(extra=extra))
        args = [str(tmp_path / "flock"), str(tmp_path / "store"), str(tmp_path / "events")]
        units.append(subprocess.Popen([sys.executable, "-c", script, *args, "1.5", str(token)]))
        time.sleep(0.05)
    for unit in units:
        assert unit.wait(timeout=30) == 0
    lines = (tmp_path / "events").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_one_holders_unit_counts_a_second_unit_alive_as_an_overlap(tmp_path: Path) -> None:
    events = start_units(tmp_path, [1, 2])
    assert sum(event["event"] == "overlap" for event in events) == 1
    assert sum(event["event"] == "end" for event in events) == 2


def test_with_two_permits_two_units_work_at_once_and_a_third_is_an_overlap(tmp_path: Path) -> None:
    (tmp_path / "two").mkdir()
    (tmp_path / "three").mkdir()
    two = start_units(tmp_path / "two", [1, 1], slots=2, permits=[0, 1])
    assert [event["event"] for event in two].count("overlap") == 0
    three = start_units(tmp_path / "three", [1, 1, 2], slots=2, permits=[0, 1, 0])
    assert [event["event"] for event in three].count("overlap") == 1


def test_the_fencing_store_is_per_permit(tmp_path: Path) -> None:
    # Token 5 on permit 1 and token 1 on permit 0 at once: no refusal, each its own store;
    # then an older token on permit 1 is refused.
    events = start_units(tmp_path, [5, 1], slots=2, permits=[1, 0])
    assert [event["event"] for event in events].count("refused") == 0
    assert (tmp_path / "store.1").exists()
    assert (tmp_path / "store.0").exists()
    later = start_units(tmp_path, [4], slots=2, permits=[1])
    assert [event["event"] for event in later].count("refused") >= 1


def works(*spans: tuple[float, float | None]) -> list[Work]:
    return [Work(f"pod-{index}", start, stop) for index, (start, stop) in enumerate(spans)]


@pytest.mark.parametrize(
    ("spans", "permits", "moments"),
    [
        ([(0, 1), (1, 2), (2, 3)], 1, 0),  # one after another, touching
        ([(0, 2), (1, 3)], 1, 1),
        ([(0, 2), (1, 3)], 2, 0),
        ([(0, 5), (1, 2), (1.5, 3)], 2, 1),
        ([(0, 5), (1, 2), (2, 3), (2.5, 4)], 2, 1),
        ([(0, None), (10, 11), (20, 21)], 1, 2),  # a running work lasts forever
        ([(0, 3), (0, 3), (0, 3)], 2, 1),
    ],
)
def test_crowded_finds_each_moment_more_than_n_ran(
    spans: list[tuple[float, float | None]], permits: int, moments: int
) -> None:
    found = crowded(works(*spans), permits)
    assert len(found) == moments
    assert all(len(moment) == permits + 1 for moment in found)
    if permits == 1:
        assert len(found) == len({second.pod for _, second in overlapping(works(*spans))})
