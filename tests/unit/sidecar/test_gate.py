"""The gate's exit codes, from the decision the sidecar leaves in the run dir."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from cronlock_sidecar.cli import main
from cronlock_sidecar.commands.gate import gate
from cronlock_sidecar.lock.model import Timing
from cronlock_sidecar.options import parse_options
from cronlock_sidecar.pod.rundir import write_decision

TIMING = Timing.of(60, 20, 2)


@pytest.mark.parametrize(
    ("decision", "code"), [("run", 0), ("overlap", 0), ("skip", 75), ("unavailable", 69)]
)
def test_gate_exits_with_the_code_of_the_decision(tmp_path: Path, decision: str, code: int) -> None:
    write_decision(tmp_path, decision, None, TIMING)
    assert main(["gate"], {"CRONLOCK_RUN_DIR": str(tmp_path)}) == code


def test_gate_waits_until_the_decision_appears(tmp_path: Path) -> None:
    timer = threading.Timer(0.3, write_decision, (tmp_path, "skip", None, TIMING))
    timer.start()
    started = time.monotonic()
    try:
        assert gate(tmp_path, timeout=10) == 75
    finally:
        timer.cancel()
    assert 0.25 < time.monotonic() - started < 2


def test_gate_fails_closed_when_no_decision_comes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    assert gate(tmp_path, timeout=60, monotonic=lambda: now[0], sleep=sleep) == 69
    assert 60 <= now[0] < 60.2
    assert "no decision from the cronlock sidecar" in caplog.text


def test_gate_timeout_is_wait_timeout_plus_a_minute(tmp_path: Path) -> None:
    options = parse_options(["gate"], {"CRONLOCK_WAIT_TIMEOUT": "2m"})
    assert options.gate_timeout == 180


def test_gate_refuses_an_unknown_decision(tmp_path: Path) -> None:
    (tmp_path / "decision").write_text("maybe\n")
    assert gate(tmp_path, timeout=1) == 69


def test_gate_polls_fast_at_first_then_ten_times_a_second(tmp_path: Path) -> None:
    now = [0.0]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    assert gate(tmp_path, timeout=5, monotonic=lambda: now[0], sleep=sleep) == 69
    fast = [seconds for seconds in sleeps if seconds < 0.1]
    assert 0.005 * len(fast) == pytest.approx(2.0, abs=0.01), "5 ms polls for the first 2 s"
    assert sleeps[len(fast) :] == [0.1] * len(sleeps[len(fast) :])
    assert len(sleeps) - len(fast) == pytest.approx(30, abs=1), "then 0.1 s polls until 5 s"
