"""The watchdog stops the work when heartbeats stop, even when its parent is frozen or dead."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cronlock_sidecar.lock.durations import format_duration
from cronlock_sidecar.lock.model import Timing

if TYPE_CHECKING:
    from tests.unit.sidecar.fakes import FakeApiServer

from tests.support.timing import (
    at_deadline,
    at_once,
    at_renew_deadline,
    earliest_renew_deadline,
    renewals_within,
)
from tests.unit.sidecar.fakes import holder, process_alive, start_run, wait_for

# What `run` hands its watchdog in the tests that drive the watchdog alone: the deadline
# (seconds from the start) and the kill grace.
DEADLINE, GRACE = 1.0, 0.5

IGNORES_SIGTERM = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)",
]

PARENT = """
import subprocess, sys, time
from cronlock_sidecar.pod import watchdog
mode, deadline, grace, command = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
armed = time.monotonic()
guard = watchdog.start(armed + deadline, grace=grace)
if mode == "mute":  # frozen between spawning CMD and saying which group: CMD says it
    cmd = subprocess.Popen(command, start_new_session=True, preexec_fn=guard.announce_self)
else:
    cmd = subprocess.Popen(command, start_new_session=True)
    guard.guard(cmd.pid)
started = time.monotonic()
if mode == "heartbeat":
    while time.monotonic() - started < 2.5 * deadline:
        guard.valid_until(time.monotonic() + deadline)
        time.sleep(0.1)
    print("alive" if cmd.poll() is None else "dead")
    cmd.kill()
    cmd.wait()
else:
    print(cmd.wait(), time.monotonic() - armed)
guard.finish()
"""


def parent(mode: str, *command: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", PARENT, mode, str(DEADLINE), str(GRACE), *command],
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
    at_deadline(DEADLINE, "the deadline was set", "the watchdog SIGTERMs CMD").check(float(elapsed))


def test_cmd_announces_its_own_group_so_a_parent_frozen_before_saying_it_is_covered() -> None:
    """A `run` frozen (or killed) between spawning CMD and sending its group once left CMD
    unwatched past its Lease: the watchdog was not armed without the group. CMD now tells
    the watchdog itself, before its first instruction; the parent here never says it."""
    code, elapsed = parent("mute", "sleep", "60")
    assert int(code) == -signal.SIGTERM
    at_deadline(DEADLINE, "the deadline was set", "the watchdog SIGTERMs CMD").check(float(elapsed))


def test_cmd_ignoring_sigterm_is_killed_after_the_grace() -> None:
    code, elapsed = parent("silent", *IGNORES_SIGTERM)
    assert int(code) == -signal.SIGKILL
    at_deadline(
        DEADLINE + GRACE, "the deadline was set", "the watchdog SIGKILLs CMD after the grace"
    ).check(float(elapsed))


# --- the guard must hold when the guard itself cannot run ----------------------------
# A ttl of 3 x SLACK leaves the slack between the renew deadline (4s) and the ttl.
RUN_TIMING = Timing.of(6, 1)


def start_guarded_sleep(
    api_server: FakeApiServer, sidecar_env: dict[str, str], tmp_path: Path
) -> tuple[subprocess.Popen[str], int]:
    pid_file = tmp_path / "cmd.pid"
    process = start_run(
        sidecar_env,
        "--ttl", format_duration(RUN_TIMING.ttl), "--renew", format_duration(RUN_TIMING.renew),
        "--kill-grace", "1s",
        "--", "sh", "-c", f"echo $$ > {pid_file}; exec sleep 60",
    )  # fmt: skip
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
    return process, int(pid_file.read_text())


def test_cmd_is_stopped_when_run_is_frozen(
    api_server: FakeApiServer, sidecar_env: dict[str, str], tmp_path: Path
) -> None:
    process, cmd_pid = start_guarded_sleep(api_server, sidecar_env, tmp_path)
    # Frozen once its heartbeat runs, so after `run` told the watchdog CMD's group: frozen
    # between spawning CMD and that message, `run` leaves CMD unguarded (a window at CMD's
    # start, reported for the product; a freeze there failed this test under load).
    wait_for(lambda: api_server.stored_writes() >= 2, timeout=renewals_within(RUN_TIMING, 1))
    os.kill(process.pid, signal.SIGSTOP)
    try:
        # No heartbeat after the freeze: CMD is stopped at the renew deadline.
        stopped = at_renew_deadline(RUN_TIMING, "the watchdog stops the frozen run's CMD")
        wait_for(lambda: not process_alive(cmd_pid), timeout=stopped.high)
        stopped.check(time.monotonic() - api_server.last_write())
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
    stopped = at_once(
        "run was killed",
        "the watchdog saw its pipe close and stopped CMD",
        instead_of=earliest_renew_deadline(RUN_TIMING),
        alternative="the watchdog's renew deadline",
    )
    wait_for(lambda: not process_alive(cmd_pid), timeout=stopped.high)
    stopped.check(time.monotonic() - killed_at)


# --- hold's watchdog: the run's processes in the pod's shared PID namespace -------------
POD_PARENT = """
import os, signal, sys, time
from pathlib import Path
from cronlock_sidecar.pod import logs
from cronlock_sidecar.pod import watchdog
logs.configure()
mode, proc_root, grace = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
guard = watchdog.start_for_pod(time.monotonic() + 1.0, grace, proc_root)
print(guard.pid, flush=True)
if mode == "freeze":
    started = time.monotonic()
    while time.monotonic() - started < 1.5:
        until = time.monotonic() + 1.0
        guard.valid_until(until)
        time.sleep(0.1)
    print("frozen", until, flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
elif mode == "die":
    guard.valid_until(time.monotonic() + 60)
    print("ready", flush=True)
    time.sleep(60)
elif mode == "stop":
    guard.valid_until(time.monotonic() + 60)
    asked = time.monotonic()
    print(guard.stop_run(), guard.reap(10), asked, flush=True)
elif mode == "done":
    guard.dismiss()
    print(guard.reap(5), flush=True)
"""


# Says so once its SIGTERM handler is installed.
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); "
    "time.sleep(60)",
]


class Pod:
    """The sidecar's stand-in (POD_PARENT), its watchdog, and two "user" processes it guards.

    The watchdog sees only `proc_root`, a directory listing these processes' pids: a broken
    exclusion can only hit the stand-ins, never the test runner.
    """

    def __init__(self, proc_root: Path) -> None:
        self.proc_root = proc_root
        self.proc_root.mkdir(parents=True)
        self.sidecar: subprocess.Popen[str] | None = None
        self.watchdog_pid: int | None = None
        self.polite = subprocess.Popen(["sleep", "60"])
        self.stubborn = subprocess.Popen(STUBBORN, stdout=subprocess.PIPE, text=True)
        assert self.stubborn.stdout
        self.stubborn.stdout.readline()
        for pid in self.user_pids:
            (self.proc_root / str(pid)).mkdir()

    def start(self, mode: str, grace: float) -> None:
        self.sidecar = subprocess.Popen(
            [sys.executable, "-c", POD_PARENT, mode, str(self.proc_root), str(grace)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.watchdog_pid = int(self.line())
        # The watchdog lists the pids only when it acts: both must be in the list and spared.
        for pid in (self.sidecar.pid, self.watchdog_pid):
            (self.proc_root / str(pid)).mkdir()

    @property
    def user_pids(self) -> list[int]:
        return sorted([self.polite.pid, self.stubborn.pid])

    @property
    def parent(self) -> subprocess.Popen[str]:
        assert self.sidecar
        return self.sidecar

    @property
    def guard(self) -> int:
        assert self.watchdog_pid
        return self.watchdog_pid

    def line(self) -> str:
        assert self.parent.stdout
        return self.parent.stdout.readline().strip()

    def user_deaths(self, timeout: float) -> dict[int, float]:
        """pid -> monotonic time its exit was seen, for the user processes that ended."""
        seen: dict[int, float] = {}
        deadline = time.monotonic() + timeout
        while len(seen) < 2 and time.monotonic() < deadline:
            for process in (self.polite, self.stubborn):
                if process.pid not in seen and process.poll() is not None:
                    seen[process.pid] = time.monotonic()
            time.sleep(0.01)
        return seen

    def log(self) -> str:
        """The sidecar's and the watchdog's stderr, once both are gone."""
        if self.parent.poll() is None:
            self.parent.kill()
        wait_for(lambda: not process_alive(self.guard), timeout=10)
        _, err = self.parent.communicate(timeout=10)
        return err

    def close(self) -> None:
        for pid in (self.watchdog_pid, self.polite.pid, self.stubborn.pid):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for process in (self.sidecar, self.polite, self.stubborn):
            if process is not None:
                if process.poll() is None:
                    process.kill()
                process.communicate()


# A grace no "at once" can be mistaken for.
LONG_GRACE = 5.0


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[Callable[[str, float], Pod]]:
    pods: list[Pod] = []

    def make(mode: str, grace: float) -> Pod:
        pods.append(Pod(tmp_path / str(len(pods)) / "proc"))
        pods[-1].start(mode, grace)
        return pods[-1]

    yield make
    for each in pods:
        each.close()


def test_a_frozen_sidecar_gets_the_runs_processes_stopped_at_the_heartbeat_deadline(
    pod: Callable[[str, float], Pod],
) -> None:
    guarded = pod("freeze", GRACE)
    word, last_deadline = guarded.line().split()
    assert word == "frozen"
    # 1.5s of heartbeats carried the run past the first deadline (1s after the start).
    assert guarded.polite.poll() is None
    assert guarded.stubborn.poll() is None
    deaths = guarded.user_deaths(timeout=5)
    assert guarded.polite.returncode == -signal.SIGTERM
    assert guarded.stubborn.returncode == -signal.SIGKILL  # after the grace
    since = "the last heartbeat's deadline"
    at_deadline(0, since, "the watchdog SIGTERMs the run's processes").check(
        deaths[guarded.polite.pid] - float(last_deadline)
    )
    at_deadline(GRACE, since, "the watchdog SIGKILLs what outlived the grace").check(
        deaths[guarded.stubborn.pid] - float(last_deadline)
    )
    assert process_alive(guarded.parent.pid), "the frozen sidecar itself is spared"
    pids = ", ".join(map(str, guarded.user_pids))
    log = guarded.log()
    assert re.search(
        rf"watchdog: no lease heartbeat from the sidecar for \d+\.\ds; "
        rf"stopping the run's processes \(pids {pids}\)",
        log,
    ), log


def test_a_dead_sidecar_gets_the_runs_processes_killed_at_once_without_the_grace(
    pod: Callable[[str, float], Pod],
) -> None:
    guarded = pod("die", LONG_GRACE)
    assert guarded.line() == "ready"
    # The run's processes share the sidecar's UID and may signal everything they see.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        os.kill(guarded.guard, signum)
    time.sleep(0.2)
    assert process_alive(guarded.guard), "only SIGKILL ends the watchdog"
    assert guarded.polite.poll() is None
    guarded.parent.kill()
    killed_at = time.monotonic()
    deaths = guarded.user_deaths(timeout=5)
    assert guarded.polite.returncode == -signal.SIGKILL  # no SIGTERM first
    assert guarded.stubborn.returncode == -signal.SIGKILL
    at_once(
        "the sidecar was killed",
        "the watchdog killed the run's processes",
        instead_of=LONG_GRACE,
        alternative="the kill grace",
    ).check(max(deaths.values()) - killed_at)
    log = guarded.log()
    assert f"watchdog: the sidecar (pid {guarded.parent.pid}) died" in log
    assert "killed the run's processes at once (pids " in log


def test_the_sidecar_hands_the_stop_of_a_lost_run_to_the_watchdog(
    pod: Callable[[str, float], Pod],
) -> None:
    guarded = pod("stop", GRACE)
    deaths = guarded.user_deaths(timeout=5)
    assert guarded.polite.returncode == -signal.SIGTERM
    assert guarded.stubborn.returncode == -signal.SIGKILL
    heard, code, asked = guarded.line().split()
    assert (heard, code) == ("True", "0")  # heard, then exited by itself
    at_deadline(GRACE, "the stop was handed over", "the watchdog SIGKILLs after the grace").check(
        deaths[guarded.stubborn.pid] - float(asked)
    )
    assert guarded.parent.wait(5) == 0, "the sidecar itself is spared"
    assert "watchdog: the sidecar lost the lease; stopping the run's processes" in guarded.log()


def test_a_dismissed_watchdog_exits_at_once_and_stops_nothing(
    pod: Callable[[str, float], Pod],
) -> None:
    guarded = pod("done", GRACE)
    assert guarded.line() == "0"  # reaped within reap()'s 5s: it exited on `done`
    assert guarded.parent.wait(5) == 0
    time.sleep(1.3)  # past the deadline it was started with, and past the sidecar's exit
    assert guarded.polite.poll() is None
    assert guarded.stubborn.poll() is None
    assert "watchdog:" not in guarded.log()
