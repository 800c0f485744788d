"""The files the sidecar shares with the gate and the user's containers, written atomically."""

from __future__ import annotations

import os

from cronlock_sidecar.contract import (
    DECISION_FILE,
    ENV_PERMIT,
    ENV_SUCCESS_FILE,
    FENCING_TOKEN_FILE,
    LEASE_FILE,
    SKIP_LINE_FILE,
    TICK_FILE,
)

# The gate imports this module to read the decision and nothing else: what only writing
# needs (json, tempfile) is imported where it writes, the types only for the checker.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

    from cronlock_sidecar.holding.lease import Acquired
    from cronlock_sidecar.lock.model import Timing
    from cronlock_sidecar.lock.ticks import Tick, TickRecord

# overlap: the observe policy runs although another run holds the Lease. already-ran:
# another run claimed this run's tick (lock/ticks.py); skipped whatever the policy.
DECISIONS = ("run", "skip", "unavailable", "overlap", "already-ran")


def write_atomically(path: Path, text: str) -> None:
    """Readers see the old file or the whole new one, never a half-written one."""
    import tempfile

    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def tick_env(
    tick: Tick | None,
    previous: TickRecord | None,
    last_success: TickRecord | None = None,
    *,
    success_file: str = "",
    permit: int | None = None,
) -> str:
    """tick.env: what the work is told of its tick (lock/ticks.py `told`), the file it
    creates to say its tick succeeded (`success_file`, "" where it need not) and the
    permit it holds (`permit`, "" when it holds none: its fencing token is that permit's),
    as lines a shell sources."""
    from cronlock_sidecar.lock.ticks import told

    told_ = {
        **told(tick, previous, last_success),
        ENV_SUCCESS_FILE: success_file,
        ENV_PERMIT: "" if permit is None else str(permit),
    }
    return "".join(f"{name}={value}\n" for name, value in told_.items())


def write_decision(
    run_dir: Path,
    decision: str,
    acquired: Acquired | None,
    timing: Timing,
    *,
    tick_text: str = "",
    skip_line: str = "",
) -> None:
    """The fencing token, lease.json and tick.env (`tick_text`) first, so the work finds them
    once `run` is visible; for `already-ran`, the skip line the gate reports."""
    if decision not in DECISIONS:
        raise ValueError(f"unknown decision {decision!r}")
    import json

    run_dir.mkdir(parents=True, exist_ok=True)
    if tick_text:
        write_atomically(run_dir / TICK_FILE, tick_text)
    if skip_line:
        write_atomically(run_dir / SKIP_LINE_FILE, skip_line + "\n")
    if acquired is not None:
        write_atomically(run_dir / FENCING_TOKEN_FILE, f"{acquired.transitions}\n")
        lease = {
            "namespace": acquired.lease.namespace,
            "name": acquired.lease.name,
            "holder": acquired.holder,
            "acquireTime": acquired.acquire_time,
            "ttl": timing.lease_duration_seconds,
            "transitions": acquired.transitions,
            "permit": acquired.permit,
        }
        write_atomically(run_dir / LEASE_FILE, json.dumps(lease, indent=2) + "\n")
    write_atomically(run_dir / DECISION_FILE, decision + "\n")


def read_decision(run_dir: str | Path) -> str | None:
    """The decision written so far, or None while the sidecar is still deciding."""
    try:
        with open(os.path.join(run_dir, DECISION_FILE), encoding="utf-8") as file:
            return file.read().strip()
    except FileNotFoundError:
        return None


def read_skip_line(run_dir: str) -> str:
    """The sidecar's skip line for the gate ("" when it wrote none)."""
    try:
        with open(os.path.join(run_dir, SKIP_LINE_FILE), encoding="utf-8") as file:
            return file.read(4096).strip()
    except FileNotFoundError:
        return ""
