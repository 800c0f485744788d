"""The init container that holds the user's containers back until the sidecar has decided.

The gate is on every guarded run's way to its work: it starts after the sidecar and the
work starts after it exits. So its path imports only what reading a file and writing one
line needs (no logging, argparse, pathlib or typing; docs/PERFORMANCE.md), and the
operator's way of running it, `cronlock-sidecar gate` with its settings in the
environment, is read here without the full option parser (`from_environment`). Anything
else, flags or a value that parser would refuse, goes through that parser (cli.py), so an
error reads the same as every other option's.
"""

from __future__ import annotations

import sys
import time

from cronlock_sidecar import contract, logline
from cronlock_sidecar.contract import EXIT_OK, EXIT_SKIPPED, EXIT_UNAVAILABLE
from cronlock_sidecar.lock.durations import DurationError, parse_duration
from cronlock_sidecar.pod.rundir import read_decision, read_skip_line

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import TextIO

LOGGER = "cronlock_sidecar.gate"
# The sidecar decides within a few hundred milliseconds of its start, and every
# millisecond the gate sleeps past the decision delays the work: poll often at first,
# then (a `wait` policy's long wait) ten times a second.
FAST_POLL_SECONDS = 0.005
FAST_POLL_FOR = 2.0
POLL_SECONDS = 0.1
EXIT_CODES = {
    "run": EXIT_OK,
    "overlap": EXIT_OK,
    "skip": EXIT_SKIPPED,
    "already-ran": EXIT_SKIPPED,
    "unavailable": EXIT_UNAVAILABLE,
}
# The settings the gate reads from the environment; any other CRONLOCK_ variable is the
# full parser's to judge.
OWN_ENV = frozenset(
    {
        contract.ENV_RUN_DIR,
        contract.ENV_WAIT_TIMEOUT,
        contract.ENV_JITTER,
        contract.ENV_LOG_FORMAT,
        contract.ENV_LOG_LEVEL,
        contract.ENV_TERMINATION_LOG,
    }
)


class GateSettings:
    """Where the decision appears, how long to wait for it, how to log (a plain class:
    NamedTuple would import typing)."""

    __slots__ = ("log_format", "log_level", "run_dir", "termination_log", "timeout")

    def __init__(
        self,
        run_dir: str,
        timeout: float,
        log_format: str = "plain",
        log_level: str = "info",
        termination_log: str = contract.TERMINATION_LOG,
    ) -> None:
        self.run_dir = run_dir
        self.timeout = timeout
        self.log_format = log_format
        self.log_level = log_level
        # Where a run whose tick already ran says so: the container's termination
        # message, which the operator reads from the pod's status.
        self.termination_log = termination_log

    def _fields(self) -> tuple[str, float, str, str, str]:
        return (self.run_dir, self.timeout, self.log_format, self.log_level, self.termination_log)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GateSettings) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            "GateSettings(run_dir={!r}, timeout={!r}, log_format={!r}, log_level={!r}, "
            "termination_log={!r})".format(*self._fields())
        )


def from_environment(env: Mapping[str, str]) -> GateSettings | None:
    """The settings of `cronlock-sidecar gate` run with its environment alone, or None where
    the full option parser must judge them (a variable the gate does not read, a bad value)."""
    for name, value in env.items():
        if name.startswith(contract.ENV_PREFIX) and value != "" and name not in OWN_ENV:
            return None
    log_format = env.get(contract.ENV_LOG_FORMAT) or "plain"
    log_level = env.get(contract.ENV_LOG_LEVEL) or "info"
    if log_format not in contract.LOG_FORMATS or log_level not in contract.LOG_LEVELS:
        return None
    # The sidecar decides after its jitter and its wait for the lock (options.gate_timeout).
    waits = 0.0
    for name in (contract.ENV_WAIT_TIMEOUT, contract.ENV_JITTER):
        text = env.get(name) or ""
        if text:
            try:
                seconds = parse_duration(text)
            except DurationError:
                return None
            if name == contract.ENV_JITTER and seconds > contract.MAX_JITTER_SECONDS:
                return None
            waits += seconds
    return GateSettings(
        run_dir=env.get(contract.ENV_RUN_DIR) or contract.RUN_DIR,
        timeout=waits + contract.GATE_TIMEOUT_AFTER_WAIT_SECONDS,
        log_format=log_format,
        log_level=log_level,
        termination_log=env.get(contract.ENV_TERMINATION_LOG) or contract.TERMINATION_LOG,
    )


def gate(
    settings: GateSettings,
    *,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    out: TextIO | None = None,
) -> int:
    """Exit 0 to run, 75 to skip, 69 when the API was unavailable or no decision came."""
    log = _Log(settings, out or sys.stderr)
    started = monotonic()
    deadline = started + settings.timeout
    while True:
        decision = read_decision(settings.run_dir)
        if decision is not None:
            return _report(decision, settings, log)
        now = monotonic()
        if now >= deadline:
            log(
                "error",
                f"no decision from the cronlock sidecar in {settings.run_dir} within "
                f"{settings.timeout:.0f}s; not running (fail closed)",
            )
            return EXIT_UNAVAILABLE
        sleep(FAST_POLL_SECONDS if now - started < FAST_POLL_FOR else POLL_SECONDS)


class _Log:
    """The gate's lines, in the sidecar's format (logline.py), at or above its level."""

    def __init__(self, settings: GateSettings, out: TextIO) -> None:
        self.settings = settings
        self.out = out

    def __call__(self, level: str, message: str) -> None:
        if not logline.shown(level, self.settings.log_level):
            return
        text = logline.line(self.settings.log_format, time.time(), level, LOGGER, message)
        self.out.write(text + "\n")
        self.out.flush()


def _report(decision: str, settings: GateSettings, log: Callable[[str, str], None]) -> int:
    run_dir = settings.run_dir
    if decision == "already-ran":
        line = read_skip_line(run_dir) or f"{contract.ALREADY_RAN}: this run's tick was worked"
        log("info", line)
        _terminate_with(settings.termination_log, line, log)
    elif decision == "run":
        log("info", "lease acquired; starting the run")
    elif decision == "overlap":
        log("warning", "another run holds the lease; observe policy: starting the run anyway")
    elif decision == "skip":
        log("info", "another run holds the lease; skipping this run")
    elif decision == "unavailable":
        log("error", "the sidecar could not reach or was refused by the API server; not running")
    else:
        log("error", f"unknown decision {decision!r} in {run_dir}; not running (fail closed)")
    return EXIT_CODES.get(decision, EXIT_UNAVAILABLE)


def _terminate_with(path: str, line: str, log: Callable[[str, str], None]) -> None:
    """The skip line as the container's termination message (best effort: the exit code
    already says skip; the line says why)."""
    try:
        with open(path, "w", encoding="utf-8") as file:
            file.write(line + "\n")
    except OSError as error:
        log("warning", f"cannot write the termination message to {path}: {error}")
