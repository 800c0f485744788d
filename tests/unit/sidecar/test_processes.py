"""Stopping local processes: SIGTERM first, SIGKILL for those that ignore it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cronlock_sidecar.pod.processes import (
    is_alive,
    kill_at_once,
    stop_group,
    terminate_then_kill,
    visible_pids,
)

IGNORES_SIGTERM = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); "
    "time.sleep(60)",
]


def test_visible_pids_skip_pid_1_ourselves_and_non_processes(tmp_path: Path) -> None:
    for name in ("1", "7", "42", "self", "sys", "300"):
        (tmp_path / name).mkdir()
    assert visible_pids(tmp_path, own_pid=42) == [7, 300]


def test_visible_pids_also_spare_the_excluded_helpers(tmp_path: Path) -> None:
    for name in ("1", "7", "42", "55", "300"):
        (tmp_path / name).mkdir()
    assert visible_pids(tmp_path, own_pid=42, exclude={55, 9999}) == [7, 300]


def test_kill_at_once_gives_no_grace_even_to_a_process_that_ignores_sigterm() -> None:
    stubborn = subprocess.Popen(IGNORES_SIGTERM, stdout=subprocess.PIPE)
    assert stubborn.stdout
    stubborn.stdout.readline()
    assert kill_at_once([stubborn.pid]) == [stubborn.pid]
    assert stubborn.wait(5) == -signal.SIGKILL
    stubborn.stdout.close()


def test_terminate_then_kill_escalates_only_for_processes_that_ignore_sigterm() -> None:
    polite = subprocess.Popen(["sleep", "60"])
    stubborn = subprocess.Popen(IGNORES_SIGTERM, stdout=subprocess.PIPE)
    assert stubborn.stdout
    stubborn.stdout.readline()  # its SIGTERM handler is installed

    def alive(pid: int) -> bool:
        process = polite if pid == polite.pid else stubborn
        return process.poll() is None

    started = time.monotonic()
    killed = terminate_then_kill([polite.pid, stubborn.pid], grace=0.5, alive=alive)
    assert killed == [stubborn.pid]
    assert polite.wait(5) == -signal.SIGTERM
    assert stubborn.wait(5) == -signal.SIGKILL
    assert time.monotonic() - started < 3
    stubborn.stdout.close()


def test_stop_group_reaches_grandchildren() -> None:
    shell = subprocess.Popen(
        ["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, start_new_session=True
    )
    assert shell.stdout
    grandchild = int(shell.stdout.readline())
    assert is_alive(grandchild)
    stop_group(shell.pid, grace=2)
    shell.wait(5)
    deadline = time.monotonic() + 5
    while is_alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not is_alive(grandchild)
    shell.stdout.close()


def test_a_zombie_does_not_count_as_alive() -> None:
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 5
    while is_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not is_alive(child.pid)  # exited, not yet reaped
    assert os.waitpid(child.pid, 0)[0] == child.pid
    child.returncode = 0
