"""Benchmarks: ratios measured side by side in one run against the local control plane.

They are not timed tests: they print a table, write JSON next to the control plane's
files and never fail on a figure. Each benchmark module exposes
`run(plane: ControlPlane, repeat: int) -> dict` and is registered in `tests/benchmarks/__main__.py`.
"""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.controlplane import ControlPlane, started
from tests.support.paths import ROOT
from tests.support.versions import pinned

BENCH_DIR = ROOT / ".testenv" / "bench"


@contextmanager
def controlplane(env_dir: Path = BENCH_DIR, keep: bool = False) -> Iterator[ControlPlane]:
    """The same control plane the tests use (`tests/controlplane/up`), in its own directory."""
    with started(env_dir, keep=keep) as plane:
        yield plane


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median and 90th percentile (inclusive method, so small samples stay within range)."""
    ordered = sorted(values)
    p90 = (
        statistics.quantiles(ordered, n=10, method="inclusive")[8]
        if len(ordered) > 1
        else ordered[0]
    )
    return {
        "median": statistics.median(ordered),
        "p90": p90,
        "min": ordered[0],
        "max": ordered[-1],
        "n": len(ordered),
    }


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    memory_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            memory_kib = int(line.split()[1])
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "memory_gib": round(memory_kib / 1024 / 1024, 1),
        "cpu": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "kubernetes": pinned("KUBERNETES_VERSION"),
        "etcd": pinned("ETCD_VERSION"),
    }


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain text table, columns padded to their widest cell."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [headers, ["-" * width for width in widths], *rows]
    ]
    return "\n".join(lines)
