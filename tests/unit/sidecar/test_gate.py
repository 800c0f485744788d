"""The gate's exit codes, from the decision the sidecar leaves in the run dir."""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from cronlock_sidecar.cli import main
from cronlock_sidecar.commands.gate import GateSettings, from_environment, gate
from cronlock_sidecar.lock.model import Timing
from cronlock_sidecar.logformat import JsonFormatter, PlainFormatter
from cronlock_sidecar.logline import PROGRAM
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
        assert gate(GateSettings(str(tmp_path), timeout=10)) == 75
    finally:
        timer.cancel()
    assert 0.25 < time.monotonic() - started < 2


def test_gate_fails_closed_when_no_decision_comes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    settings = GateSettings(str(tmp_path), timeout=60)
    assert gate(settings, monotonic=lambda: now[0], sleep=sleep) == 69
    assert 60 <= now[0] < 60.2
    assert "ERROR no decision from the cronlock sidecar" in capsys.readouterr().err


def test_gate_timeout_is_wait_timeout_plus_a_minute(tmp_path: Path) -> None:
    options = parse_options(["gate"], {"CRONLOCK_WAIT_TIMEOUT": "2m"})
    assert options.gate_timeout == 180


def test_gate_refuses_an_unknown_decision(tmp_path: Path) -> None:
    (tmp_path / "decision").write_text("maybe\n")
    assert gate(GateSettings(str(tmp_path), timeout=1)) == 69


def test_gate_polls_fast_at_first_then_ten_times_a_second(tmp_path: Path) -> None:
    now = [0.0]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    assert gate(GateSettings(str(tmp_path), timeout=5), monotonic=lambda: now[0], sleep=sleep) == 69
    fast = [seconds for seconds in sleeps if seconds < 0.1]
    assert 0.005 * len(fast) == pytest.approx(2.0, abs=0.01), "5 ms polls for the first 2 s"
    assert sleeps[len(fast) :] == [0.1] * len(sleeps[len(fast) :])
    assert len(sleeps) - len(fast) == pytest.approx(30, abs=1), "then 0.1 s polls until 5 s"


# The operator runs `cronlock-sidecar gate` with its settings in the environment; the gate
# reads them without the option parser. Each of these must come out as the parser has it.
GATE_ENVIRONMENTS = [
    {},
    {"CRONLOCK_RUN_DIR": "/var/run/cronlock", "CRONLOCK_WAIT_TIMEOUT": "0s"},
    {"CRONLOCK_RUN_DIR": "/elsewhere", "CRONLOCK_WAIT_TIMEOUT": "1h30m"},
    {"CRONLOCK_WAIT_TIMEOUT": "1.5s", "CRONLOCK_LOG_FORMAT": "json"},
    {"CRONLOCK_LOG_LEVEL": "error", "CRONLOCK_RUN_DIR": ""},
    {"CRONLOCK_WAIT_TIMEOUT": "", "PATH": "/usr/bin", "HOSTNAME": "pod-1"},
]


@pytest.mark.parametrize("env", GATE_ENVIRONMENTS)
def test_the_gate_reads_its_environment_as_the_option_parser_does(env: dict[str, str]) -> None:
    options = parse_options(["gate"], env)
    assert from_environment(env) == GateSettings(
        options.run_dir, options.gate_timeout, options.log_format, options.log_level
    )


# A value the parser refuses, or a setting the gate does not read: the parser judges it,
# so the error reads like every other option's (exit 78).
PARSER_JUDGES = [
    ({"CRONLOCK_WAIT_TIMEOUT": "ten minutes"}, "--wait-timeout (from CRONLOCK_WAIT_TIMEOUT)"),
    ({"CRONLOCK_WAIT_TIMEOUT": "-5s"}, "--wait-timeout (from CRONLOCK_WAIT_TIMEOUT)"),
    ({"CRONLOCK_LOG_FORMAT": "xml"}, "--log-format (from CRONLOCK_LOG_FORMAT)"),
    ({"CRONLOCK_LOG_LEVEL": "loud"}, "--log-level (from CRONLOCK_LOG_LEVEL)"),
    ({"CRONLOCK_TTL": "soon"}, "--ttl (from CRONLOCK_TTL)"),
]


@pytest.mark.parametrize(("env", "named"), PARSER_JUDGES)
def test_a_setting_the_gate_does_not_take_as_it_is_goes_to_the_option_parser(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], env: dict[str, str], named: str
) -> None:
    assert from_environment(env) is None
    write_decision(tmp_path, "run", None, TIMING)
    assert main(["gate"], {"CRONLOCK_RUN_DIR": str(tmp_path), **env}) == 78
    assert f"cronlock-sidecar: {named}:" in capsys.readouterr().err


def test_another_cronlock_setting_goes_to_the_option_parser_even_when_valid(
    tmp_path: Path,
) -> None:
    env = {"CRONLOCK_RUN_DIR": str(tmp_path), "CRONLOCK_POLICY": "replace"}
    assert from_environment(env) is None
    write_decision(tmp_path, "skip", None, TIMING)
    assert main(["gate"], env) == 75


@pytest.mark.parametrize("log_format", ["plain", "json"])
def test_the_gates_line_is_the_sidecars_log_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], log_format: str
) -> None:
    # The gate writes its line without logging (logline.py); the sidecar's formatter
    # must give the very same line for the same time and message.
    write_decision(tmp_path, "skip", None, TIMING)
    settings = GateSettings(str(tmp_path), timeout=1, log_format=log_format)
    assert gate(settings) == 75
    line = capsys.readouterr().err.rstrip("\n")
    formatter = JsonFormatter() if log_format == "json" else PlainFormatter(PROGRAM)
    if log_format == "json":
        created = datetime.fromisoformat(json.loads(line)["timestamp"]).timestamp()
    else:
        stamp, millis = line[:23].split(",")
        created = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000
    record = logging.LogRecord(
        "cronlock_sidecar.gate",
        logging.INFO,
        __file__,
        1,
        "another run holds the lease; skipping this run",
        None,
        None,
    )
    record.created = created + 0.0004  # inside the same millisecond
    assert formatter.format(record) == line


def test_the_gate_keeps_to_its_log_level(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_decision(tmp_path, "run", None, TIMING)
    assert gate(GateSettings(str(tmp_path), timeout=1, log_level="warning")) == 0
    assert capsys.readouterr().err == ""
    (tmp_path / "decision").write_text("unavailable\n")
    assert gate(GateSettings(str(tmp_path), timeout=1, log_level="warning")) == 69
    assert " ERROR the sidecar could not reach" in capsys.readouterr().err
