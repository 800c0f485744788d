"""`cronlock-sidecar hold`: decision files, probes, renewals, release, and the watchdog."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cronlock_sidecar.commands.hold import Holder, RunGuard
from cronlock_sidecar.lock.durations import format_duration
from cronlock_sidecar.lock.model import Timing
from cronlock_sidecar.options import parse_options
from cronlock_sidecar.pod.state import SidecarState
from cronlock_sidecar.transport.seam import Lease, LeaseRef

if TYPE_CHECKING:
    from tests.unit.sidecar.fakes import FakeApiServer

from tests.support.kube import holds
from tests.support.leases import make_lease
from tests.support.ports import free_port
from tests.support.timing import (
    SLACK,
    at_next_renewal,
    at_once,
    at_renew_deadline,
    earliest_renew_deadline,
    renewals_within,
)
from tests.unit.sidecar.fakes import (
    FakeClock,
    FakeTransport,
    holder,
    process_alive,
    wait_for,
)

ME = "report-29001-x7k2p_3f2a9c1e"
# The real-process tests' timing: a ttl of 3 x SLACK leaves the slack between the renew
# deadline (4s) and the ttl (tests/support/timing.py).
TIMING = Timing.of(6, 1)


def timing_args(timing: Timing) -> tuple[str, ...]:
    return ("--ttl", format_duration(timing.ttl), "--renew", format_duration(timing.renew))


# `hold` as the pod runs it, except that its watchdog sees only the processes listed in the
# directory argv[1] instead of /proc: a test can never have it signal the test runner.
HOLD_WITH_PROC_ROOT = """
import sys
from pathlib import Path
from cronlock_sidecar import cli
from cronlock_sidecar.commands import hold
hold.Holder.__init__.__kwdefaults__["proc_root"] = Path(sys.argv[1])
sys.exit(cli.main(sys.argv[2:]))
"""


class Sidecar:
    def __init__(
        self, env: dict[str, str], run_dir: Path, *args: str, proc_root: Path | None = None
    ) -> None:
        self.port = free_port()
        self.run_dir = run_dir
        program = (
            ["-m", "cronlock_sidecar.cli"]
            if proc_root is None
            else ["-c", HOLD_WITH_PROC_ROOT, str(proc_root)]
        )
        self.process = subprocess.Popen(
            [
                sys.executable, *program, "hold",
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

    def serve(self) -> None:
        """What cli.py passes as Serving.start: records what was decided by then."""
        self.events.append(f"serve, decided {self.decision() or 'nothing'}")

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

    def start(*args: str, proc_root: Path | None = None) -> Sidecar:
        sidecar = Sidecar(sidecar_env, tmp_path / "run", *args, proc_root=proc_root)
        started.append(sidecar)
        wait_for(lambda: _serving(sidecar))
        return sidecar

    yield start
    for sidecar in started:
        sidecar.kill()


def _serving(sidecar: Sidecar) -> bool:
    if sidecar.process.poll() is not None:
        _, err = sidecar.process.communicate()
        raise AssertionError(f"the sidecar exited {sidecar.process.returncode}: {err}")
    return _listening(sidecar) and sidecar.get("/healthz")[0] == 200


def _listening(sidecar: Sidecar) -> bool:
    try:
        socket.create_connection(("127.0.0.1", sidecar.port), timeout=0.2).close()
    except OSError:
        return False
    return True


def test_hold_acquires_writes_the_run_dir_serves_held_and_releases_on_sigterm(
    api_server: FakeApiServer, start_sidecar: Callable[..., Sidecar]
) -> None:
    api_server.put_lease(make_lease(transitions=6))
    timing = Timing.of(3, 0.5)
    sidecar = start_sidecar(*timing_args(timing))
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
    wait_for(
        lambda: api_server.writes() - writes_before >= 2,
        timeout=renewals_within(timing, 2),
    )
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
    api_server.put_lease(make_lease("pod-a_11111111", renewed=datetime.now(UTC)))
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
    api_server.put_lease(make_lease(ME, renewed=datetime.now(UTC), transitions=3))
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
    api_server.put_lease(make_lease())  # free: someone released or cleared it meanwhile
    sidecar = start_sidecar()
    time.sleep(0.5)
    assert sidecar.get("/held")[0] == 503
    code, err = sidecar.terminate()
    assert code == 0
    assert "lost" in err
    assert api_server.writes() == 0
    assert holder(api_server) == ""


def test_restarted_hold_whose_lease_went_silent_past_the_deadline_fails_closed(
    api_server: FakeApiServer, start_sidecar: Callable[..., Sidecar], tmp_path: Path
) -> None:
    # The Lease still names this pod, but its last renewal is an hour old: the run's work
    # went on unguarded (the others believe a hold for ttl + skew only). The restarted
    # sidecar does not renew it back to life; /held never answers 200.
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "decision").write_text("run\n")
    an_hour_ago = datetime.fromtimestamp(time.time() - 3600, UTC)
    api_server.put_lease(make_lease(ME, renewed=an_hour_ago, transitions=3))
    sidecar = start_sidecar()
    answers = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "lost_total 1" not in sidecar.get("/metrics")[1]:
        answers.append(sidecar.get("/held")[0])
        time.sleep(0.05)
    answers.append(sidecar.get("/held")[0])
    code, err = sidecar.terminate()
    assert "past the renew deadline" in err
    assert "stopped, not resumed" in err
    assert 200 not in answers
    assert api_server.writes() == 0
    lease = api_server.get_lease()
    assert lease
    assert lease["spec"]["leaseTransitions"] == 3
    assert code == 0


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
    # The renew deadline passes during the test, long after the takeover was seen; the
    # renew thread and the main thread both see the loss, it counts once.
    timing = Timing.of(6, 0.5)
    sidecar = start_sidecar(*timing_args(timing))
    wait_for(lambda: sidecar.get("/held")[0] == 200)
    taken_at = time.monotonic()
    api_server.put_lease(make_lease("thief", transitions=50))
    seen = at_next_renewal(timing, "the takeover", "/held answers 503")
    wait_for(lambda: sidecar.get("/held")[0] == 503, timeout=seen.high)
    seen.check(time.monotonic() - taken_at)
    wait_for(lambda: "cronlock_sidecar_lost_total 1" in sidecar.get("/metrics")[1], timeout=SLACK)
    # The main thread wakes at the renew deadline of the last renewal it sent.
    past_deadline = api_server.last_write() + timing.renew_deadline + SLACK - time.monotonic()
    holds(
        lambda: "cronlock_sidecar_lost_total 1\n" in sidecar.get("/metrics")[1],
        past_deadline,
        "the loss counted once",
        every=0.2,
    )
    code, err = sidecar.terminate()
    assert code == 0
    assert "now held by thief" in err
    assert holder(api_server) == "thief"


def test_hold_reports_loss_when_renewals_fail_past_the_deadline(
    api_server: FakeApiServer, start_sidecar: Callable[..., Sidecar]
) -> None:
    sidecar = start_sidecar(*timing_args(TIMING))
    wait_for(lambda: sidecar.get("/held")[0] == 200)
    api_server.broken = True
    lost = at_renew_deadline(TIMING, "/held answers 503")
    wait_for(lambda: sidecar.get("/held")[0] == 503, timeout=lost.high)
    lost.check(time.monotonic() - api_server.last_write())
    sidecar.kill()


# --- `stop: signal`: the watchdog, driven by an in-process holder ----------------------
class FakeWatchdog:
    """Records what the holder tells its watchdog; `hears` False plays one that is gone."""

    def __init__(self, events: list[str], pid: int = 4242, *, hears: bool = True) -> None:
        self.events = events
        self.pid = pid
        self.hears = hears

    def valid_until(self, deadline: float) -> None:
        self.events.append(f"until {deadline:.3f}")

    def stop_run(self) -> bool:
        self.events.append("stop")
        return self.hears

    def dismiss(self) -> None:
        self.events.append("done")

    def reap(self, timeout: float) -> int | None:
        self.events.append("reaped")
        return 0


class RecordingTransport(FakeTransport):
    """Records every Lease write among the events; each one moves the fake clock 0.1s on."""

    def __init__(self, clock: FakeClock, events: list[str], lease: Lease) -> None:
        super().__init__(lease)
        self.clock = clock
        self.events = events

    def replace(self, lease: LeaseRef, body: Lease, *, timeout: float | None = None) -> Lease:
        self.events.append("write " + (body["spec"].get("holderIdentity") or "(nobody)"))
        try:
            return super().replace(lease, body, timeout=timeout)
        finally:
            self.clock.advance(0.1)


class InProcess:
    """A Holder on a thread, with a fake clock, transport and watchdog, and its event log."""

    def __init__(
        self,
        tmp_path: Path,
        clock: FakeClock,
        lease: Lease,
        stop_mode: str,
        policy: str = "skip",
        wait_timeout: str | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.events: list[str] = []
        self.run_dir = tmp_path / "run"
        self.proc_root = tmp_path / "proc"
        self.proc_root.mkdir()
        self.transport = RecordingTransport(clock, self.events, lease)
        self.watchdog_pid = 4242
        self.watchdog_hears = True
        self.start_error: OSError | None = None
        options = parse_options(
            [
                "hold", "--lease", "default/cronlock-report", "--identity", ME,
                "--ttl", "3s", "--renew", "200ms", "--kill-grace", "1s", "--stop", stop_mode,
                "--run-dir", str(self.run_dir), "--policy", policy,
                *(["--wait-timeout", wait_timeout] if wait_timeout else []), *extra,
            ],
            {},
        )  # fmt: skip
        self.stop = threading.Event()
        self.state = SidecarState()
        self.holder = Holder(
            options,
            self.transport,
            clock,
            self.state,
            self.stop,
            start_watchdog=self.start_watchdog,
            proc_root=self.proc_root,
            serve=self.serve,
        )
        self.codes: list[int] = []
        self.thread = threading.Thread(target=lambda: self.codes.append(self.holder.run()))

    def start_watchdog(self, valid_until: float, grace: float) -> RunGuard:
        decided = (self.run_dir / "decision").exists()
        self.events.append(f"start until {valid_until:.3f} grace {grace:g} decided {decided}")
        if self.start_error is not None:
            raise self.start_error
        return FakeWatchdog(self.events, self.watchdog_pid, hears=self.watchdog_hears)

    def serve(self) -> None:
        """What cli.py passes as Serving.start: records what was decided by then."""
        self.events.append(f"serve, decided {self.decision() or 'nothing'}")

    def decision(self) -> str:
        path = self.run_dir / "decision"
        return path.read_text().strip() if path.exists() else ""

    def untils(self) -> list[float]:
        return [float(event.split()[1]) for event in self.events if event.startswith("until")]

    def terminate(self) -> int:
        self.stop.set()
        self.thread.join(10)
        assert not self.thread.is_alive()
        return self.codes[0]


@pytest.fixture
def in_process(tmp_path: Path, clock: FakeClock) -> Iterator[Callable[..., InProcess]]:
    made: list[InProcess] = []

    def make(
        stop_mode: str,
        lease: Lease | None = None,
        policy: str = "skip",
        wait_timeout: str | None = None,
        extra: tuple[str, ...] = (),
    ) -> InProcess:
        made.append(
            InProcess(
                tmp_path, clock, lease or make_lease(), stop_mode, policy, wait_timeout, extra
            )
        )
        return made[-1]

    yield make
    for each in made:
        each.stop.set()
        each.thread.join(5)


def test_signal_mode_starts_the_watchdog_before_the_gate_may_run_and_feeds_it_on_renewals(
    in_process: Callable[..., InProcess],
) -> None:
    held = in_process("signal")
    held.thread.start()
    wait_for(lambda: len(held.untils()) >= 3)
    assert held.decision() == "run"
    assert held.terminate() == 0
    # Acquired (sent at 1000.0, renew deadline 2s), then the watchdog, then the decision.
    assert held.events[:2] == [f"write {ME}", "start until 1002.000 grace 1 decided False"]
    # Each renewal is sent 0.1s after the previous write; its heartbeat is its new deadline.
    untils = held.untils()
    assert untils == pytest.approx([1002.1 + 0.1 * n for n in range(len(untils))])
    # SIGTERM: the watchdog is dismissed before the release, so it never kills on our exit.
    done = held.events.index("done")
    assert held.events[done:] == ["done", "write (nobody)", "reaped"]
    assert holder_of(held.transport) == ""


def test_liveness_mode_starts_no_watchdog(in_process: Callable[..., InProcess]) -> None:
    held = in_process("liveness")
    held.thread.start()
    wait_for(lambda: held.events.count(f"write {ME}") >= 3)
    assert held.decision() == "run"
    assert held.terminate() == 0
    assert [event for event in held.events if not event.startswith(("write", "serve"))] == []


def test_a_lost_lease_is_stopped_by_the_watchdog_and_the_sidecar_signals_nothing(
    in_process: Callable[..., InProcess],
) -> None:
    held = in_process("signal")
    user = subprocess.Popen(["sleep", "60"])
    try:
        (held.proc_root / str(user.pid)).mkdir()
        held.thread.start()
        wait_for(lambda: held.decision() == "run")
        held.transport.before_write.append(taken_by_a_thief)
        wait_for(lambda: "stop" in held.events)
        time.sleep(0.3)
        assert user.poll() is None, "the watchdog stops the run, not the sidecar as well"
        assert held.terminate() == 0
        assert held.events[-2:] == ["done", "reaped"]
        assert holder_of(held.transport) == "thief"
    finally:
        user.kill()
        user.wait()


def test_a_lost_lease_with_the_watchdog_gone_is_stopped_by_the_sidecar_sparing_the_watchdog(
    in_process: Callable[..., InProcess],
) -> None:
    held = in_process("signal")
    user = subprocess.Popen(["sleep", "60"])
    stand_in = subprocess.Popen(["sleep", "60"])  # plays the watchdog's pid
    try:
        held.watchdog_pid = stand_in.pid
        held.watchdog_hears = False
        for process in (user, stand_in):
            (held.proc_root / str(process.pid)).mkdir()
        held.thread.start()
        wait_for(lambda: held.decision() == "run")
        held.transport.before_write.append(taken_by_a_thief)
        assert user.wait(5) == -signal.SIGTERM
        assert stand_in.poll() is None
        assert held.terminate() == 0
    finally:
        for process in (user, stand_in):
            process.kill()
            process.wait()


def test_a_restarted_sidecar_that_resumes_its_run_guards_it_again(
    in_process: Callable[..., InProcess], clock: FakeClock
) -> None:
    held = in_process("signal", make_lease(ME, renewed=clock.now(), transitions=3))
    held.run_dir.mkdir()
    (held.run_dir / "decision").write_text("run\n")
    held.thread.start()
    wait_for(lambda: len(held.untils()) >= 1)
    assert held.terminate() == 0
    # Serving first: the run's containers are probing /held already.
    assert held.events[:3] == [
        "serve, decided run",
        f"write {ME}",
        "start until 1002.000 grace 1 decided True",
    ]


def test_the_endpoints_start_once_the_decision_is_written_not_before(
    in_process: Callable[..., InProcess],
) -> None:
    # Nothing probes the port before the decision (the run's containers start after the
    # gate), and the HTTP server's start is not on the way to it (pod/serving.py).
    held = in_process("liveness")
    held.thread.start()
    wait_for(lambda: any(event.startswith("serve") for event in held.events))
    assert held.terminate() == 0
    assert held.events[:2] == [f"write {ME}", "serve, decided run"]


def test_a_skipping_sidecar_serves_too(
    in_process: Callable[..., InProcess], clock: FakeClock
) -> None:
    held = in_process("liveness", make_lease("someone-else", renewed=clock.now()))
    held.thread.start()
    wait_for(lambda: any(event.startswith("serve") for event in held.events))
    assert held.terminate() == 0
    assert held.events[0] == "serve, decided skip"


def test_a_sidecar_told_another_n_than_the_stores_document_skips_and_writes_nothing(
    in_process: Callable[..., InProcess], clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A store lock's N comes from CRONLOCK_PERMITS; a document that says another N is
    held by runs of the old N (docs/USAGE.md, "Permits"): a skip, not a failed pod."""
    lease = make_lease(
        "someone-else", renewed=clock.now(), annotations={"cronlock.io/permits": "3"}
    )
    held = in_process("liveness", lease, extra=("--permits", "2"))
    held.thread.start()
    wait_for(lambda: held.decision() != "")
    assert held.decision() == "skip"
    assert held.terminate() == 0
    assert not [event for event in held.events if event.startswith("write")]
    assert "says '3' permits (cronlock.io/permits) but this run requires 2" in caplog.text


def test_a_waiting_sidecar_serves_while_it_waits(
    in_process: Callable[..., InProcess], clock: FakeClock
) -> None:
    # `wait` may take minutes: /metrics and /healthz answer meanwhile.
    held = in_process("liveness", make_lease("someone-else", renewed=clock.now()), "wait", "10m")
    held.thread.start()
    wait_for(lambda: any(event.startswith("serve") for event in held.events))
    assert held.decision() == ""
    assert held.terminate() == 0
    assert held.events[0] == "serve, decided nothing"


def test_a_watchdog_that_cannot_be_started_means_no_run(
    in_process: Callable[..., InProcess], caplog: pytest.LogCaptureFixture
) -> None:
    held = in_process("signal")
    held.start_error = OSError(errno.EAGAIN, "Resource temporarily unavailable")
    with caplog.at_level(logging.ERROR, logger="cronlock_sidecar.hold"):
        held.thread.start()
        wait_for(lambda: held.decision() != "")
        assert held.decision() == "unavailable"
        assert held.terminate() == 0
    assert holder_of(held.transport) == "", "released at once"
    assert (
        "cannot start the watchdog process: [Errno 11] Resource temporarily unavailable; "
        "this run will not start" in caplog.text
    )


def taken_by_a_thief(transport: FakeTransport) -> None:
    transport.store(make_lease("thief", transitions=50))


def holder_of(transport: FakeTransport) -> str:
    assert transport.lease
    return str(transport.lease["spec"].get("holderIdentity") or "")


# --- `stop: signal` in a real sidecar process --------------------------------------------
@pytest.fixture
def user_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A "user" process and the only process directory the sidecar's watchdog sees."""
    proc_root = tmp_path / "proc"
    proc_root.mkdir()
    process = subprocess.Popen(["sleep", "60"])
    (proc_root / str(process.pid)).mkdir()
    yield process, proc_root
    process.kill()
    process.wait()


SIGNAL_MODE = ("--stop", "signal", *timing_args(TIMING), "--kill-grace", "500ms")


def test_signal_mode_a_frozen_sidecar_has_its_run_stopped_by_its_watchdog(
    api_server: FakeApiServer,
    start_sidecar: Callable[..., Sidecar],
    user_process: tuple[subprocess.Popen[bytes], Path],
) -> None:
    user, proc_root = user_process
    sidecar = start_sidecar(*SIGNAL_MODE, proc_root=proc_root)
    wait_for(lambda: sidecar.decision() == "run")
    written = api_server.stored_writes()
    # A renewal first: its heartbeat gives the deadline measured below.
    wait_for(lambda: api_server.stored_writes() > written, timeout=renewals_within(TIMING, 1))
    assert user.poll() is None
    os.kill(sidecar.process.pid, signal.SIGSTOP)
    try:
        # The watchdog acts at the renew deadline of the last heartbeat; what must hold,
        # even on a loaded machine, is that the run is stopped before the ttl has passed
        # since the last renewal, when another run could take the lock (after ttl + skew).
        stopped = at_renew_deadline(TIMING, "the watchdog stops the frozen sidecar's run")
        assert user.wait(stopped.high) == -signal.SIGTERM
        stopped.check(time.monotonic() - api_server.last_write())
        assert process_alive(sidecar.process.pid), "the frozen sidecar itself is spared"
    finally:
        os.kill(sidecar.process.pid, signal.SIGKILL)
    _, err = sidecar.process.communicate(timeout=10)
    assert "watchdog: no lease heartbeat from the sidecar for" in err


def test_signal_mode_a_killed_sidecar_has_its_run_killed_at_once(
    api_server: FakeApiServer,
    start_sidecar: Callable[..., Sidecar],
    user_process: tuple[subprocess.Popen[bytes], Path],
) -> None:
    user, proc_root = user_process
    sidecar = start_sidecar(*SIGNAL_MODE, proc_root=proc_root)
    wait_for(lambda: sidecar.decision() == "run")
    sidecar.process.kill()
    killed_at = time.monotonic()
    killed = at_once(
        "the sidecar was killed",
        "its watchdog saw the pipe close and killed the run",
        instead_of=earliest_renew_deadline(TIMING),
        alternative="the watchdog's renew deadline",
    )
    assert user.wait(killed.high) == -signal.SIGKILL
    killed.check(time.monotonic() - killed_at)
    _, err = sidecar.process.communicate(timeout=10)
    assert re.search(r"watchdog: the sidecar \(pid \d+\) died", err), err


def test_signal_mode_a_normal_end_kills_nothing_and_does_not_wait_for_the_watchdog(
    api_server: FakeApiServer,
    start_sidecar: Callable[..., Sidecar],
    user_process: tuple[subprocess.Popen[bytes], Path],
) -> None:
    user, proc_root = user_process
    sidecar = start_sidecar(*SIGNAL_MODE, proc_root=proc_root)
    wait_for(lambda: sidecar.decision() == "run")
    started = time.monotonic()
    code, err = sidecar.terminate()
    assert code == 0, err
    at_once(
        "SIGTERM",
        "the sidecar released and exited",
        instead_of=earliest_renew_deadline(TIMING),
        alternative="waiting for the watchdog's renew deadline",
    ).check(time.monotonic() - started)
    assert holder(api_server) == ""
    found = re.search(r"watchdog process (\d+) guards the run", err)
    assert found, err
    assert not process_alive(int(found.group(1))), "it exited on `done`"
    # Exited, it acts at no deadline; a watchdog not dismissed would have seen its pipe
    # close when the sidecar exited and killed at once.
    holds(lambda: user.poll() is None, SLACK, "a dismissed watchdog kills nothing", every=0.1)
    assert "watchdog:" not in err


# --- the replace and observe policies in `hold` -------------------------------------------
def asked_to_yield_by(identity: str) -> Callable[[FakeTransport], None]:
    def ask(transport: FakeTransport) -> None:
        assert transport.lease is not None
        noted = dict(transport.lease)
        noted["metadata"] = {
            **noted["metadata"],
            "annotations": {**noted["metadata"]["annotations"], "cronlock.io/yield-to": identity},
        }
        transport.store(noted)

    return ask


def test_a_holder_asked_to_yield_stops_its_run_and_releases_naming_who_replaced_it(
    in_process: Callable[..., InProcess],
) -> None:
    held = in_process("signal", policy="replace")
    held.thread.start()
    wait_for(lambda: held.decision() == "run")
    held.transport.before_write.append(asked_to_yield_by("newer-pod_22222222"))
    wait_for(lambda: "stop" in held.events)  # the watchdog stops the run's processes
    assert not held.state.is_held()  # /held answers 503
    # SIGTERM comes once the run's containers ended: then it releases, naming the new run.
    assert held.terminate() == 0
    assert holder_of(held.transport) == ""
    assert held.transport.lease is not None
    annotations = held.transport.lease["metadata"]["annotations"]
    assert annotations["cronlock.io/replaced-by"] == "newer-pod_22222222"


@pytest.mark.parametrize("policy", ["skip", "wait"])
def test_only_a_replace_run_yields_to_a_note_any_pod_on_the_account_may_write(
    in_process: Callable[..., InProcess], policy: str
) -> None:
    """Security review N8: a pod on the account writes cronlock.io/yield-to naming itself;
    a run that did not choose `replace` keeps its lock and its work."""
    held = in_process("signal", policy=policy)
    held.thread.start()
    wait_for(lambda: held.decision() == "run")
    held.transport.before_write.append(asked_to_yield_by("intruder_22222222"))
    renewed = len(held.untils())
    wait_for(lambda: len(held.untils()) >= renewed + 2)  # renewed twice since the note
    assert "stop" not in held.events
    assert held.state.is_held()
    assert holder_of(held.transport) == ME
    assert held.terminate() == 0


def test_observe_runs_without_the_lease_and_held_answers_200(
    in_process: Callable[..., InProcess],
) -> None:
    held = in_process("liveness", make_lease("report-29000-abcde_11111111"), policy="observe")
    held.thread.start()
    wait_for(lambda: held.decision() == "overlap")
    assert held.state.is_held(), "the probe must never stop an observe run"
    assert not held.state.held
    assert holder_of(held.transport) == "report-29000-abcde_11111111"
    assert held.transport.lease is not None
    assert held.transport.lease["metadata"]["annotations"]["cronlock.io/overlap"] == ME
    assert held.terminate() == 0
    assert holder_of(held.transport) == "report-29000-abcde_11111111"  # never touched


def test_observe_with_the_lease_lost_keeps_the_run_going(
    in_process: Callable[..., InProcess],
) -> None:
    held = in_process("signal", policy="observe")
    held.thread.start()
    wait_for(lambda: held.decision() == "run")
    held.transport.before_write.append(taken_by_a_thief)
    wait_for(lambda: held.holder.keeper.lost)
    assert held.state.is_held()
    assert held.terminate() == 0
    assert "stop" not in held.events
    assert not any(event.startswith("start until") for event in held.events)  # no watchdog


def held_for(line: str) -> float:
    """The seconds a `max-hold exceeded: held D, bound B` line says the run held the lock."""
    match = re.fullmatch(r"max-hold exceeded: held ([0-9.]+)s, bound 1s\n", line)
    assert match is not None, line
    return float(match.group(1))


@pytest.mark.parametrize("stop_mode", ["signal", "liveness"])
def test_a_run_past_its_max_hold_is_stopped_but_its_lease_is_renewed_until_the_pod_ends(
    in_process: Callable[..., InProcess], tmp_path: Path, stop_mode: str
) -> None:
    message = tmp_path / "termination-log"
    held = in_process(stop_mode, extra=("--max-hold", "1s", "--termination-log", str(message)))
    held.thread.start()
    wait_for(lambda: message.exists() and message.read_text() != "")
    # Each write moves the fake clock 0.1s on, the acquire's too: held from the acquire.
    assert 1.0 <= held_for(message.read_text()) <= 1.0 + 0.2  # within one renew period
    writes = held.events.count(f"write {ME}")
    assert writes >= 10, "the bound counts from the acquire, not before"
    assert not held.state.is_held(), "/held answers 503: the kubelet stops the work"
    if stop_mode == "signal":
        assert held.events.count("stop") == 1, "the watchdog stops the run's processes once"
        stopped = held.events.index("stop")
    else:
        assert "stop" not in held.events
        stopped = len(held.events)
    # The Lease stays this run's, renewed, until the pod ends: its processes may still be
    # stopping, and no other run may start meanwhile.
    wait_for(lambda: held.events.count(f"write {ME}") >= writes + 3)
    assert holder_of(held.transport) == ME
    assert held.state.held
    assert [e for e in held.events[stopped:] if e.startswith("until")] == [], (
        "no heartbeat to a watchdog that has stopped the run and exited"
    )
    # The pod's SIGTERM once its work ended: the release gives the Lease back.
    assert held.terminate() == 0
    assert holder_of(held.transport) == ""
    assert held.events[-1] == "reaped" if stop_mode == "signal" else "write (nobody)"


def test_a_run_within_its_max_hold_is_never_stopped(
    in_process: Callable[..., InProcess], tmp_path: Path
) -> None:
    message = tmp_path / "termination-log"
    held = in_process("signal", extra=("--max-hold", "1h", "--termination-log", str(message)))
    held.thread.start()
    wait_for(lambda: held.events.count(f"write {ME}") >= 12)
    assert held.state.is_held()
    assert "stop" not in held.events
    assert not message.exists()
    assert held.terminate() == 0
    assert holder_of(held.transport) == ""


def test_a_restarted_sidecar_counts_max_hold_from_the_leases_acquire_not_its_restart(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A sidecar that crashes and is restarted must not give its run a fresh bound."""
    acquired = clock.now() - timedelta(hours=2)
    lease = make_lease(ME, acquired=acquired, renewed=clock.now(), transitions=3)
    message = tmp_path / "termination-log"
    held = InProcess(
        tmp_path, clock, lease, "liveness",
        extra=("--max-hold", "1h", "--termination-log", str(message)),
    )  # fmt: skip
    held.run_dir.mkdir()
    (held.run_dir / "decision").write_text("run\n")
    try:
        held.thread.start()
        wait_for(lambda: message.exists() and message.read_text() != "")
        assert message.read_text().startswith("max-hold exceeded: held 2h")
        assert not held.state.is_held()
    finally:
        assert held.terminate() == 0
