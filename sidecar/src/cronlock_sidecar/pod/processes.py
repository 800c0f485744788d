"""Stopping work locally, because a run that lost its lease usually cannot reach the API server."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

log = logging.getLogger("cronlock_sidecar.processes")

PROC = Path("/proc")


def is_alive(pid: int, proc_root: Path = PROC) -> bool:
    """Running or stopped, not a zombie waiting to be reaped."""
    try:
        stat = (proc_root / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = stat.rpartition(")")[2].split()[:1]
    return state not in (["Z"], ["X"])


def visible_pids(
    proc_root: Path = PROC, own_pid: int | None = None, exclude: Collection[int] = ()
) -> list[int]:
    """Every process in our PID namespace except us, PID 1 (the pod's pause) and `exclude`."""
    me = os.getpid() if own_pid is None else own_pid
    spared = {1, me, *exclude}
    pids = []
    for entry in proc_root.iterdir():
        if entry.name.isdigit():
            pid = int(entry.name)
            if pid not in spared:
                pids.append(pid)
    return sorted(pids)


def _signal(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    except PermissionError as error:
        log.error("cannot send %s to pid %d: %s", signal.Signals(signum).name, pid, error)
        return False
    return True


def terminate_then_kill(
    pids: Iterable[int],
    grace: float,
    *,
    alive: Callable[[int], bool] = is_alive,
    poll: float = 0.05,
) -> list[int]:
    """SIGTERM each process, SIGKILL those still alive after `grace`; returns the killed ones."""
    targets = [pid for pid in pids if _signal(pid, signal.SIGTERM)]
    if targets:
        log.warning("sent SIGTERM to pids %s; SIGKILL in %.1fs", targets, grace)
    deadline = time.monotonic() + grace
    while targets and time.monotonic() < deadline:
        targets = [pid for pid in targets if alive(pid)]
        if targets:
            time.sleep(poll)
    killed = [pid for pid in targets if alive(pid) and _signal(pid, signal.SIGKILL)]
    if killed:
        log.warning("sent SIGKILL to pids %s", killed)
    return killed


def kill_at_once(pids: Iterable[int]) -> list[int]:
    """SIGKILL each process now, for when nothing may wait any longer; returns the killed ones."""
    killed = [pid for pid in pids if _signal(pid, signal.SIGKILL)]
    if killed:
        log.warning("sent SIGKILL to pids %s", killed)
    return killed


def group_alive(pgid: int, proc_root: Path = PROC) -> bool:
    """Some member of the process group still runs; zombies waiting to be reaped do not count."""
    if not proc_root.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="utf-8", errors="replace")
        except (FileNotFoundError, ProcessLookupError):
            continue
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in {"Z", "X"}:
            return True
    return False


def stop_group(pgid: int, grace: float, *, poll: float = 0.05) -> bool:
    """SIGTERM a process group, SIGKILL it after `grace`; True if SIGKILL was needed."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return False
        time.sleep(poll)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True
