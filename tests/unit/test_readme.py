"""README.md stays a front page: at most 200 lines, and no measured figures (those live,
with the commands that measured them, in docs/PERFORMANCE.md and docs/RELIABILITY.md)."""

from __future__ import annotations

import re

from tests.support.paths import ROOT

README = ROOT / "README.md"
MAX_LINES = 200
# A measurement: a decimal duration, milliseconds, a size in MiB/GiB, a percentage, a
# ratio, or a count with a thousands separator ("1,241 runs").
FIGURE = re.compile(
    r"\d+\.\d+ ?s\b|\d+ ?ms\b|\d+(\.\d+)? ?[MG]iB\b|\d+(\.\d+)? ?%|\d+(\.\d+)?\u00d7|\d,\d{3}\b"
)


def test_the_readme_is_at_most_200_lines() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md is {len(lines)} lines; keep it to {MAX_LINES}"


def test_the_readme_quotes_no_figures() -> None:
    found = [
        f"{number}: {line.strip()}"
        for number, line in enumerate(README.read_text().splitlines(), 1)
        if FIGURE.search(line)
    ]
    assert found == [], "figures belong in docs/PERFORMANCE.md or docs/RELIABILITY.md"


def test_the_figure_pattern_finds_what_the_readme_once_quoted() -> None:
    for quoted in ("starts 0.29 s later", "1,241 faulted runs", "CPU 1.90\u00d7", "91 → 473 MiB"):
        assert FIGURE.search(quoted), quoted
    for setting in ('cronlock.io/ttl: "60s"', "Kubernetes 1.30 or newer", "--version 0.1.0"):
        assert not FIGURE.search(setting), setting
