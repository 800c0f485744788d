"""The checker's tick mode counts ticks, not only overlaps: each tick given to two or more
contenders (`run --tick T --tick-of X`, as two clusters' pods of one tick would start), how
many ticks were worked twice (each tick at most once: must be 0) and how many were never
worked, and why.

A tick is worked when a work unit of it started (its `start` event carries CRONLOCK_TICK);
worked twice when work units of two runs started. A tick never worked is
- superseded: a contender of it skipped `already ran` naming a later tick: a later tick
  took the lock first (the promise is at most once; a tick overtaken is not run late);
- lost in an outage: every contender of it ended unable to reach the lock (exit 69);
- lost while healthy: anything else, a contender of it up and able to reach the lock and no
  run of it working: must be 0.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

EXIT_UNAVAILABLE = 69
EXIT_SKIPPED = 75
# ticks.skip_line: "already ran: tick <T> of <cronjob> on lock <lock> was claimed by ...
# for tick <R>; skipping this run"
ALREADY_RAN = re.compile(
    r"already ran: tick (\S+) of \S+ on lock \S+ was claimed by .* for tick (\S+);"
)


@dataclass(kw_only=True)
class TickCounts:
    ticks: int = 0
    worked: int = 0
    worked_twice: int = 0
    never_worked: int = 0
    superseded: int = 0
    lost_in_outage: int = 0
    lost_while_healthy: int = 0
    skipped_already_ran: int = 0
    # Ticks worked twice or lost while healthy, for the report (at most a few).
    examples: list[str] = field(default_factory=list)

    def add(self, other: TickCounts) -> None:
        for name in (
            "ticks", "worked", "worked_twice", "never_worked", "superseded",
            "lost_in_outage", "lost_while_healthy", "skipped_already_ran",
        ):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.examples = (self.examples + other.examples)[:10]

    def summary(self) -> dict[str, Any]:
        return {
            "ticks": self.ticks,
            "worked": self.worked,
            "worked_twice": self.worked_twice,
            "never_worked": self.never_worked,
            "superseded": self.superseded,
            "lost_in_outage": self.lost_in_outage,
            "lost_while_healthy": self.lost_while_healthy,
            "skipped_already_ran": self.skipped_already_ran,
            "examples": self.examples,
        }


def skips_in(log: str) -> list[tuple[str, str]]:
    """(tick, recorded tick) of each `already ran` line in the contenders' log."""
    return [(match.group(1), match.group(2)) for match in ALREADY_RAN.finditer(log)]


def count_ticks(
    issued: Iterable[str],
    starts: Iterable[tuple[str, int]],
    exits: Iterable[tuple[str, int]],
    skips: Iterable[tuple[str, str]],
) -> TickCounts:
    """Per tick issued: the runs that started work on it (`starts`: tick, run), how its
    contenders exited (`exits`: tick, code) and the `already ran` skips of it (`skips`:
    tick, the tick the lock recorded)."""
    runs_by_tick: dict[str, set[int]] = collections.defaultdict(set)
    for tick, run in starts:
        runs_by_tick[tick].add(run)
    codes_by_tick: dict[str, list[int]] = collections.defaultdict(list)
    for tick, code in exits:
        codes_by_tick[tick].append(code)
    recorded_by_tick: dict[str, list[str]] = collections.defaultdict(list)
    for tick, later in skips:
        recorded_by_tick[tick].append(later)
    counts = TickCounts()
    for tick in issued:
        counts.ticks += 1
        codes = sorted(codes_by_tick.get(tick, []))
        recorded_ticks = recorded_by_tick.get(tick, [])
        counts.skipped_already_ran += len(recorded_ticks)
        runs = runs_by_tick.get(tick, set())
        if runs:
            counts.worked += 1
            if len(runs) > 1:
                counts.worked_twice += 1
                counts.examples.append(f"{tick} worked by {len(runs)} runs")
            continue
        counts.never_worked += 1
        if any(later > tick for later in recorded_ticks):  # RFC 3339 in UTC sorts as time does
            counts.superseded += 1
        elif codes and all(code == EXIT_UNAVAILABLE for code in codes):
            counts.lost_in_outage += 1
        else:
            counts.lost_while_healthy += 1
            counts.examples.append(f"{tick} never worked, contenders exited {codes}")
    counts.examples = counts.examples[:10]
    return counts
