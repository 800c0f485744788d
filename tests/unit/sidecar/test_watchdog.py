"""The watchdog stops CMD when heartbeats stop, even when `run` itself is frozen or dead."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.unit.sidecar.conftest import FakeApiServer

from tests.unit.sidecar.conftest import holder, process_alive, start_run, wait_for

IGNORES_SIGTERM = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)",
]

PARENT = """
import subprocess, sys, time
from cronlock_sidecar import watchdog
mode, command = sys.argv[1], sys.argv[2:]
guard = watchdog.start(time.monotonic() + 1.0, grace=0.5)
cmd = subprocess.Popen(command, start_new_session=True)
guard.guard(cmd.pid)
started = time.monotonic()
if mode == "heartbeat":
    while time.monotonic() - started < 2.5:
        guard.valid_until(time.monotonic() + 1.0)
        time.sleep(0.1)
    print("alive" if cmd.poll() is None else "dead")
    cmd.kill()
    cmd.wait()
else:
    print(cmd.wait(), round(time.monotonic() - started, 1))
guard.finish()
"""


def parent(mode: str, *command: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", PARENT, mode, *command],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return result.stdout.split()


def test_fresh_heartbeats_keep_cmd_running_past_the_first_deadline() -> None:
    assert parent("heartbeat", "sleep", "60") == ["alive"]


def test_cmd_is_terminated_when_heartbeats_stop() -> None:
    code, elapsed = parent("silent", "sleep", "60")
    assert int(code) == -signal.SIGTERM
    assert 0.8 <= float(elapsed) < 2.0


def test_cmd_ignoring_sigterm_is_killed_after_the_grace() -> None:
    code, elapsed = parent("silent", *IGNORES_SIGTERM)
    assert int(code) == -signal.SIGKILL
    assert 1.3 <= float(elapsed) < 3.0


# --- the guard must hold when the guard itself cannot run ----------------------------
def start_guarded_sleep(
    api_server: FakeApiServer, sidecar_env: dict[str, str], tmp_path: Path
) -> tuple[subprocess.Popen[str], int]:
    pid_file = tmp_path / "cmd.pid"
    process = start_run(
        sidecar_env,
        "--ttl", "3s", "--renew", "500ms", "--kill-grace", "1s",
        "--", "sh", "-c", f"echo $$ > {pid_file}; exec sleep 60",
    )  # fmt: skip
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
    return process, int(pid_file.read_text())


def test_cmd_is_stopped_when_run_is_frozen(
    api_server: FakeApiServer, sidecar_env: dict[str, str], tmp_path: Path
) -> None:
    process, cmd_pid = start_guarded_sleep(api_server, sidecar_env, tmp_path)
    os.kill(process.pid, signal.SIGSTOP)
    try:
        stopped_at = time.monotonic()
        wait_for(lambda: not process_alive(cmd_pid), timeout=6)
        # No heartbeat after the freeze: CMD is stopped within the renew deadline (2s).
        assert time.monotonic() - stopped_at < 2.8
        assert holder(api_server) != ""  # run never released: only the watchdog acted
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.communicate()


def test_cmd_is_stopped_when_run_is_killed(
    api_server: FakeApiServer, sidecar_env: dict[str, str], tmp_path: Path
) -> None:
    process, cmd_pid = start_guarded_sleep(api_server, sidecar_env, tmp_path)
    os.kill(process.pid, signal.SIGKILL)
    process.communicate()
    killed_at = time.monotonic()
    wait_for(lambda: not process_alive(cmd_pid), timeout=5)
    assert time.monotonic() - killed_at < 1.5
