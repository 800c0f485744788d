"""`cronlock-sidecar hold` as the native sidecar: decision files, probes, renewals, release."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.unit.sidecar.conftest import FakeApiServer

from tests.unit.sidecar.conftest import holder, lease_object, wait_for

ME = "report-29001-x7k2p_3f2a9c1e"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Sidecar:
    def __init__(self, env: dict[str, str], run_dir: Path, *args: str) -> None:
        self.port = free_port()
        self.run_dir = run_dir
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "cronlock_sidecar.cli", "hold",
                "--lease", "default/cronlock-report", "--port", str(self.port), *args,
            ],
            env={
                **env,
                "CRONLOCK_RUN_DIR": str(run_dir),
                "CRONLOCK_POD_NAME": "report-29001-x7k2p",
                "CRONLOCK_POD_UID": "3f2a9c1e-aaaa-4000-8000-000000000000",
                "CRONLOCK_JOB_NAME": "report-29001",
            },
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as answer:
                return int(answer.status), answer.read().decode()
        except urllib.error.HTTPError as error:
            return int(error.code), error.read().decode()

    def decision(self) -> str:
        path = self.run_dir / "decision"
        return path.read_text().strip() if path.exists() else ""

    def terminate(self) -> tuple[int, str]:
        self.process.send_signal(signal.SIGTERM)
        _, err = self.process.communicate(timeout=10)
        return self.process.returncode, err

    def kill(self) -> None:
        if self.process.returncode is not None:
            return
        self.process.kill()
        self.process.communicate()


@pytest.fixture
def start_sidecar(sidecar_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Sidecar]]:
    started: list[Sidecar] = []

    def start(*args: str) -> Sidecar:
        sidecar = Sidecar(sidecar_env, tmp_path / "run", *args)
        started.append(sidecar)
        wait_for(lambda: sidecar.get("/healthz")[0] == 200 if _listening(sidecar) else False)
        return sidecar

    yield start
    for sidecar in started:
        sidecar.kill()


def _listening(sidecar: Sidecar) -> bool:
    try:
        socket.create_connection(("127.0.0.1", sidecar.port), timeout=0.2).close()
    except OSError:
        return False
    return True


def test_hold_acquires_writes_the_run_dir_serves_held_and_releases_on_sigterm(
    api_server: FakeApiServer, start_sidecar: Callable[..., Sidecar]
) -> None:
    api_server.put_lease(lease_object(transitions=6))
    sidecar = start_sidecar("--ttl", "3s", "--renew", "500ms")
    wait_for(lambda: sidecar.decision() == "run")
    assert (sidecar.run_dir / "fencing-token").read_text() == "7\n"
    lease_file = json.loads((sidecar.run_dir / "lease.json").read_text())
    assert lease_file["namespace"] == "default"
    assert lease_file["name"] == "cronlock-report"
    assert lease_file["holder"] == ME
    assert lease_file["transitions"] == 7
    assert lease_file["ttl"] == 3
    assert sidecar.get("/held") == (200, "held\n")
    lease = api_server.get_lease()
    assert lease
    assert lease["metadata"]["annotations"]["cronlock.io/holder-job"] == "report-29001"

    writes_before = api_server.writes()
    time.sleep(1.2)
    assert api_server.writes() - writes_before >= 2  # renewing every 500ms
    status, metrics = sidecar.get("/metrics")
    assert status == 200
    assert "cronlock_sidecar_held 1" in metrics
    assert 'cronlock_sidecar_renewals_total{result="renewed"}' in metrics
    assert "cronlock_sidecar_fencing_token 7" in metrics

    code, err = sidecar.terminate()
    assert code == 0, err
    assert holder(api_server) == ""
    assert "released by " + ME in err


def test_hold_skips_when_held_and_stays_idle_until_sigterm(
    api_server: FakeApiServer, start_sidecar: Callable[..., Sidecar]
) -> None:
    api_server.put_lease(lease_object("pod-a_11111111", renewed=datetime.now(UTC)))
    sidecar = start_sidecar()
    wait_for(lambda: sidecar.decision() == "skip")
    assert not (sidecar.run_dir / "fencing-token").exists()
    assert sidecar.get("/held")[0] == 503
    time.sleep(0.3)
    assert sidecar.process.poll() is None  # an exited native sidecar would be restarted
    writes = api_server.writes()
    code, err = sidecar.terminate()
    assert code == 0
    assert "already running: lease default/cronlock-report held by pod-a_11111111" in err
    assert api_server.writes() == writes
    assert holder(api_server) == "pod-a_11111111"


def test_hold_decides_unavailable_when_forbidden(
    api_server: FakeApiServer, start_sidecar: Callable[..., Sidecar]
) -> None:
    api_server.forbidden.add("get")
    sidecar = start_sidecar()
    wait_for(lambda: sidecar.decision() == "unavailable")
    assert sidecar.get("/held")[0] == 503
    code, err = sidecar.terminate()
    assert code == 0
    assert "forbidden: cannot get lease default/cronlock-report" in err


def test_restarted_hold_resumes_a_lease_it_still_holds(
    api_server: FakeApiServer, start_sidecar: Callable[..., Sidecar], tmp_path: Path
) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "decision").write_text("run\n")
    api_server.put_lease(lease_object(ME, renewed=datetime.now(UTC), transitions=3))
    sidecar = start_sidecar()
    wait_for(lambda: sidecar.get("/held")[0] == 200)
    lease = api_server.get_lease()
    assert lease
    assert lease["spec"]["leaseTransitions"] == 3
    code, _ = sidecar.terminate()
    assert code == 0
    assert holder(api_server) == ""


def test_restarted_hold_whose_lease_was_taken_reports_lost_and_never_retakes_it(
    api_server: FakeApiServer, start_sidecar: Callable[..., Sidecar], tmp_path: Path
) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "decision").write_text("run\n")
    api_server.put_lease(lease_object())  # free: someone released or cleared it meanwhile
    sidecar = start_sidecar()
    time.sleep(0.5)
    assert sidecar.get("/held")[0] == 503
    code, err = sidecar.terminate()
    assert code == 0
    assert "lost" in err
    assert api_server.writes() == 0
    assert holder(api_server) == ""


def test_restarted_hold_after_a_skip_stays_idle_without_api_calls(
    api_server: FakeApiServer, start_sidecar: Callable[..., Sidecar], tmp_path: Path
) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "decision").write_text("skip\n")
    sidecar = start_sidecar()
    time.sleep(0.3)
    assert sidecar.get("/held")[0] == 503
    assert sidecar.terminate()[0] == 0
    assert api_server.requests == []


def test_hold_reports_loss_on_held_when_the_holder_changes(
    api_server: FakeApiServer, start_sidecar: Callable[..., Sidecar]
) -> None:
    # ttl 3s: the renew deadline (2s) passes during the test, long after the takeover was
    # seen; the renew thread and the main thread both see the loss, it counts once.
    sidecar = start_sidecar("--ttl", "3s", "--renew", "300ms")
    wait_for(lambda: sidecar.get("/held")[0] == 200)
    taken_at = time.monotonic()
    api_server.put_lease(lease_object("thief", transitions=50))
    wait_for(lambda: sidecar.get("/held")[0] == 503, timeout=3)
    assert time.monotonic() - taken_at < 1.5, "seen at the next renew, not at the deadline"
    wait_for(lambda: "cronlock_sidecar_lost_total 1" in sidecar.get("/metrics")[1], timeout=2)
    time.sleep(max(0.0, taken_at + 2.5 - time.monotonic()))
    assert "cronlock_sidecar_lost_total 1\n" in sidecar.get("/metrics")[1]
    code, err = sidecar.terminate()
    assert code == 0
    assert "now held by thief" in err
    assert holder(api_server) == "thief"


def test_hold_reports_loss_when_renewals_fail_past_the_deadline(
    api_server: FakeApiServer, start_sidecar: Callable[..., Sidecar]
) -> None:
    sidecar = start_sidecar("--ttl", "3s", "--renew", "500ms")
    wait_for(lambda: sidecar.get("/held")[0] == 200)
    api_server.broken = True
    broken_at = time.monotonic()
    wait_for(lambda: sidecar.get("/held")[0] == 503, timeout=5)
    assert time.monotonic() - broken_at < 2.5  # renew deadline: 2/3 of 3s
    sidecar.kill()
