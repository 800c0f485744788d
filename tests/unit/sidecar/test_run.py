"""`cronlock-sidecar run` end to end against a fake Lease API server, in real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cronlock_sidecar.contract import ANNOTATION_LAST_HOLDER

if TYPE_CHECKING:
    from tests.unit.sidecar.conftest import FakeApiServer

from tests.unit.sidecar.conftest import lease_object

SIDECAR = [sys.executable, "-m", "cronlock_sidecar.cli"]
LEASE_ARGS = ["--lease", "default/cronlock-report"]


def start_run(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*SIDECAR, "run", *LEASE_ARGS, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str], timeout: float = 20) -> tuple[int, str]:
    _, err = process.communicate(timeout=timeout)
    return process.returncode, err


def run_sidecar(env: dict[str, str], *args: str) -> tuple[int, str]:
    return finish(start_run(env, *args))


def wait_for(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def holder(api_server: FakeApiServer) -> str:
    lease = api_server.get_lease()
    return str(lease["spec"].get("holderIdentity", "")) if lease else ""


def process_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] not in {"Z", "X"}


def test_run_passes_the_fencing_token_exits_with_cmd_status_and_releases(
    api_server: FakeApiServer, sidecar_env: dict[str, str], tmp_path: Path
) -> None:
    api_server.put_lease(lease_object(transitions=41))
    token_file = tmp_path / "token"
    code, err = run_sidecar(
        sidecar_env,
        "--identity",
        "me",
        "--",
        "sh",
        "-c",
        f'echo "$CRONLOCK_FENCING_TOKEN" > {token_file}; exit 3',
    )
    assert code == 3, err
    assert token_file.read_text().strip() == "42"
    lease = api_server.get_lease()
    assert lease
    assert "holderIdentity" not in lease["spec"]
    assert lease["spec"]["leaseTransitions"] == 42
    assert lease["metadata"]["annotations"][ANNOTATION_LAST_HOLDER] == "me"
    assert "lease default/cronlock-report acquired by me (transitions 42" in err
    assert "lease default/cronlock-report released by me" in err


def test_run_creates_a_missing_lease(
    api_server: FakeApiServer, sidecar_env: dict[str, str]
) -> None:
    code, err = run_sidecar(sidecar_env, "--", "true")
    assert code == 0, err
    lease = api_server.get_lease()
    assert lease
    assert lease["spec"]["leaseTransitions"] == 1
    assert "holderIdentity" not in lease["spec"]


def test_run_skips_with_75_when_a_live_run_holds_the_lease(
    api_server: FakeApiServer, sidecar_env: dict[str, str], tmp_path: Path
) -> None:
    from datetime import UTC, datetime, timedelta

    renewed = datetime.now(UTC) - timedelta(seconds=5)
    api_server.put_lease(lease_object("pod-a_11111111", renewed=renewed))
    marker = tmp_path / "ran"
    code, err = run_sidecar(sidecar_env, "--", "touch", str(marker))
    assert code == 75
    assert (
        "already running: lease default/cronlock-report held by pod-a_11111111 "
        "(renewed 5s ago, expires in 55s); skipping this run"
    ) in err
    assert not marker.exists()
    assert holder(api_server) == "pod-a_11111111"


def test_run_fails_closed_with_69_when_forbidden(
    api_server: FakeApiServer, sidecar_env: dict[str, str], tmp_path: Path
) -> None:
    api_server.forbidden.add("get")
    marker = tmp_path / "ran"
    code, err = run_sidecar(sidecar_env, "--", "touch", str(marker))
    assert code == 69
    assert "forbidden: cannot get lease default/cronlock-report: HTTP 403" in err
    assert not marker.exists()


def test_run_fails_closed_with_69_when_the_api_is_unreachable(
    sidecar_env: dict[str, str], tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "unreachable"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    code, err = run_sidecar({**sidecar_env, "KUBECONFIG": str(kubeconfig)}, "--", "true")
    assert code == 69
    assert "unavailable: cannot get lease default/cronlock-report: http://127.0.0.1:9" in err


def test_run_renews_while_cmd_outlives_the_renew_deadline(
    api_server: FakeApiServer, sidecar_env: dict[str, str]
) -> None:
    # ttl 3s: the renew deadline is 2s, so CMD survives only if heartbeats reach the watchdog.
    code, err = run_sidecar(sidecar_env, "--ttl", "3s", "--renew", "500ms", "--", "sleep", "3")
    assert code == 0, err
    assert api_server.writes() >= 1 + 4 + 1  # acquire, renewals, release


def test_run_stops_cmd_and_exits_70_when_renewals_fail_past_the_deadline(
    api_server: FakeApiServer, sidecar_env: dict[str, str]
) -> None:
    process = start_run(
        sidecar_env, "--ttl", "3s", "--renew", "500ms", "--kill-grace", "1s", "--", "sleep", "30"
    )
    wait_for(lambda: holder(api_server) != "")
    api_server.broken = True
    started = time.monotonic()
    code, err = finish(process)
    assert code == 70, err
    assert time.monotonic() - started < 3.5  # deadline 2s after the last good renew, then SIGTERM
    assert "renew failed" in err
    assert "lost" in err


def test_run_stops_cmd_at_once_when_another_holder_took_the_lease(
    api_server: FakeApiServer, sidecar_env: dict[str, str]
) -> None:
    process = start_run(sidecar_env, "--ttl", "30s", "--renew", "300ms", "--", "sleep", "30")
    wait_for(lambda: holder(api_server) != "")
    api_server.put_lease(lease_object("thief", transitions=99))
    code, err = finish(process, timeout=5)
    assert code == 70, err
    assert "now held by thief" in err
    assert holder(api_server) == "thief"


def test_sigterm_is_forwarded_to_cmd_and_the_lease_released(
    api_server: FakeApiServer, sidecar_env: dict[str, str]
) -> None:
    process = start_run(sidecar_env, "--", "sleep", "30")
    wait_for(lambda: holder(api_server) != "")
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    code, err = finish(process, timeout=5)
    assert code == 128 + signal.SIGTERM, err
    assert time.monotonic() - started < 2
    assert holder(api_server) == ""


def test_missing_command_exits_127_and_releases(
    api_server: FakeApiServer, sidecar_env: dict[str, str]
) -> None:
    code, err = run_sidecar(sidecar_env, "--", "/nonexistent/cmd")
    assert code == 127
    assert "cannot run /nonexistent/cmd" in err
    assert holder(api_server) == ""
    lease = api_server.get_lease()
    assert lease
    assert lease["metadata"]["annotations"][ANNOTATION_LAST_HOLDER]


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


@pytest.mark.parametrize("log_format", ["json"])
def test_json_logs_are_one_object_per_line(
    api_server: FakeApiServer, sidecar_env: dict[str, str], log_format: str
) -> None:
    import json

    code, err = run_sidecar(sidecar_env, "--log-format", log_format, "--", "true")
    assert code == 0
    messages = [json.loads(line)["message"] for line in err.splitlines()]
    assert any(message.startswith("lease default/cronlock-report acquired") for message in messages)
