"""Jitter (lock/jitter.py): the offset per tick and its distribution, `--jitter`, the gate's
timeout, `hold` waiting before it decides (serving, stopping on SIGTERM), and `run --jitter`."""

from __future__ import annotations

import re
import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cronlock_sidecar import contract
from cronlock_sidecar.commands.gate import GateSettings, from_environment
from cronlock_sidecar.commands.hold import Holder
from cronlock_sidecar.lock.jitter import jitter_of, random_offset, tick_offset
from cronlock_sidecar.lock.ticks import format_tick
from cronlock_sidecar.options import ConfigError, parse_options
from cronlock_sidecar.pod.state import SidecarState
from cronlock_sidecar.transport.seam import Lease, LeaseRef
from tests.support.leases import make_lease
from tests.support.timing import SLACK
from tests.unit.sidecar.fakes import FakeClock, FakeTransport, finish, start_run, wait_for

if TYPE_CHECKING:
    from tests.unit.sidecar.fakes import FakeApiServer

NOON = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
# The chi-square statistic with 9 degrees of freedom exceeds this with probability 0.001:
# a fixed sample (deterministic inputs) that stays under it is uniform by any usual test.
CHI_SQUARE_9_AT_0_001 = 27.877


def chi_square(offsets: list[float], bound: float, buckets: int = 10) -> float:
    counts = [0] * buckets
    for offset in offsets:
        counts[int(offset / bound * buckets)] += 1
    expected = len(offsets) / buckets
    return sum((count - expected) ** 2 / expected for count in counts)


# --- the offset ------------------------------------------------------------------------
def test_a_ticks_offset_is_the_same_for_every_pod_and_within_the_bound() -> None:
    first = tick_offset("report", NOON, 30)
    assert first == tick_offset("report", NOON, 30)
    assert 0 <= first < 30
    # Another tick, another CronJob: another instant.
    assert tick_offset("report", NOON + timedelta(hours=1), 30) != first
    assert tick_offset("billing", NOON, 30) != first
    # The fraction of the bound is the tick's: a longer bound scales it.
    assert tick_offset("report", NOON, 60) == pytest.approx(2 * first)


def test_offsets_are_uniform_over_ticks_and_over_cronjobs_on_one_schedule() -> None:
    hourly = [tick_offset("report", NOON + timedelta(hours=n), 30) for n in range(5000)]
    assert all(0 <= offset < 30 for offset in hourly)
    assert chi_square(hourly, 30) < CHI_SQUARE_9_AT_0_001
    # A thousand CronJobs on `0 * * * *` spread over the jitter at the same tick.
    fleet = [tick_offset(f"report-{n}", NOON, 600) for n in range(1000)]
    assert chi_square(fleet, 600) < CHI_SQUARE_9_AT_0_001
    # ... and not all in the first few seconds, as with no jitter.
    assert max(fleet) - min(fleet) > 590


def test_a_manual_runs_offset_is_drawn_uniformly_from_the_os() -> None:
    assert random_offset(30, lambda n: b"\x00" * n) == 0
    assert random_offset(30, lambda n: b"\x80" + b"\x00" * (n - 1)) == 15
    assert 29.99 < random_offset(30, lambda n: b"\xff" * n) < 30
    drawn = [random_offset(30) for _ in range(2000)]
    assert all(0 <= offset < 30 for offset in drawn)
    assert len(set(drawn)) == len(drawn)


def test_a_pod_that_starts_late_waits_only_for_what_is_left_and_a_retry_for_the_same_instant() -> (
    None
):
    offset = tick_offset("report", NOON, 30)
    on_time = jitter_of(30, NOON, ("report", NOON))
    assert on_time.wait == pytest.approx(offset)
    assert on_time.starts_at == NOON + timedelta(seconds=offset)
    late = jitter_of(30, NOON + timedelta(seconds=offset / 2), ("report", NOON))
    assert late.wait == pytest.approx(offset / 2)
    assert late.starts_at == on_time.starts_at
    # A retry pod after the instant: at once.
    assert jitter_of(30, NOON + timedelta(seconds=31), ("report", NOON)).wait == 0


def test_the_line_says_when_and_why() -> None:
    offset = tick_offset("report", NOON, 30)
    line = jitter_of(30, NOON, ("report", NOON)).line()
    at = (NOON + timedelta(seconds=offset)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    assert line == (
        f"jitter: the run starts in {offset:.1f}s, at {at} (tick 2026-12-06T12:00:00Z of "
        f"report, offset {offset:.3f}s, up to 30s)"
    )
    manual = jitter_of(90, NOON, None, lambda n: b"\x80" + b"\x00" * (n - 1)).line()
    assert manual == (
        "jitter: the run starts in 45.0s, at 2026-12-06T12:00:45.000Z (a manual run, random "
        "offset 45.000s, up to 1m30s)"
    )


# --- the option --------------------------------------------------------------------------
HOLD = ["hold", "--lease", "default/cronlock-report", "--identity", "me"]


def test_jitter_is_an_option_with_its_environment_twin_and_is_added_to_the_gates_wait() -> None:
    assert parse_options(HOLD, {}).jitter == 0
    assert parse_options([*HOLD, "--jitter", "30s"], {}).jitter == 30
    assert parse_options(HOLD, {contract.ENV_JITTER: "1m"}).jitter == 60
    assert parse_options(["gate"], {contract.ENV_JITTER: "1m"}).gate_timeout == (
        60 + contract.GATE_TIMEOUT_AFTER_WAIT_SECONDS
    )
    run = parse_options(["run", "--lease", "a/b", "--jitter", "1h", "--", "true"], {})
    assert run.jitter == 3600


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1h0m1s", "--jitter: 1h1s is out of range; expected 0 (no jitter) to 1h"),
        ("99999999h", "is out of range; expected 0 (no jitter) to 1h"),
        ("-5s", "--jitter: '-5s' is not a duration"),
        ("soon", "--jitter: 'soon' is not a duration"),
        ("30", "--jitter: '30' is not a duration"),
    ],
)
def test_a_bad_jitter_is_refused_with_the_accepted_range(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_options([*HOLD, f"--jitter={value}"], {})


def test_the_gate_as_the_operator_runs_it_waits_for_the_jitter_too() -> None:
    env = {contract.ENV_WAIT_TIMEOUT: "2m", contract.ENV_JITTER: "30s"}
    assert from_environment(env) == GateSettings(
        contract.RUN_DIR, 150 + contract.GATE_TIMEOUT_AFTER_WAIT_SECONDS
    )
    # A value the full parser refuses goes to it, so that its error reads as the others'.
    assert from_environment({contract.ENV_JITTER: "2h"}) is None
    assert from_environment({contract.ENV_JITTER: "later"}) is None


# --- hold --------------------------------------------------------------------------------
class Stop(threading.Event):
    """The sidecar's stop event on a fake clock: a timed wait moves the clock instead of
    sleeping; `stop_at` says which wait (1: the jitter's) SIGTERM arrives in."""

    def __init__(self, clock: FakeClock, events: list[str], stop_at: int = 0) -> None:
        super().__init__()
        self.clock = clock
        self.events = events
        self.stop_at = stop_at
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is None:
            self.set()
            return True
        self.waits.append(timeout)
        self.events.append(f"wait {timeout:.3f}")
        self.clock.advance(timeout)
        # The second timed wait is the holding loop's: end the pod there.
        if len(self.waits) in (self.stop_at, 2):
            self.set()
        return self.is_set()


class Recording(FakeTransport):
    def __init__(self, events: list[str]) -> None:
        super().__init__(make_lease())
        self.events = events

    def get(self, lease: LeaseRef, *, timeout: float | None = None) -> Lease:
        self.events.append("get")
        return super().get(lease, timeout=timeout)


def hold(
    tmp_path: Path, clock: FakeClock, *args: str, stop_at: int = 0
) -> tuple[Holder, Stop, list[str]]:
    events: list[str] = []
    stop = Stop(clock, events, stop_at)
    options = parse_options(
        [*HOLD, "--ttl", "3s", "--renew", "1s", "--run-dir", str(tmp_path / "run"), *args], {}
    )
    holder = Holder(
        options,
        Recording(events),
        clock,
        SidecarState(),
        stop,
        serve=lambda: events.append("serve"),
    )
    return holder, stop, events


def tick_job(clock: FakeClock, late: float) -> tuple[datetime, list[str]]:
    """A tick's Job whose nominal time is `late` seconds before the fake clock's now."""
    minutes = int(clock.now().timestamp() // 60)
    nominal = datetime.fromtimestamp(minutes * 60, UTC)
    clock.advance(late - (clock.now() - nominal).total_seconds())
    job = f"report-{minutes}"
    return nominal, ["--cronjob", "report", "--job-name", job, "--job-uid", "uid-1"]


def test_hold_waits_out_the_ticks_jitter_serving_before_it_takes_the_lock(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    nominal, job = tick_job(clock, late=2.0)
    offset = tick_offset("report", nominal, 600)
    holder, stop, events = hold(tmp_path, clock, "--jitter", "10m", *job)
    caplog.set_level("INFO", logger="cronlock_sidecar.hold")
    assert holder.run() == 0
    # Served first, waited what was left of its offset, and only then read the lock.
    assert events[:3] == ["serve", f"wait {offset - 2:.3f}", "get"]
    assert stop.waits[0] == pytest.approx(offset - 2)
    assert holder.state.decision == "run"
    assert f"tick {format_tick(nominal)} of report, offset {offset:.3f}s, up to 10m" in caplog.text


def test_hold_stopped_during_its_jitter_takes_and_releases_nothing_and_exits_0(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    holder, stop, events = hold(tmp_path, clock, "--jitter", "1h", stop_at=1)
    caplog.set_level("INFO", logger="cronlock_sidecar.hold")
    assert holder.run() == 0
    assert "get" not in events
    assert not (tmp_path / "run" / "decision").exists()
    assert 0 <= stop.waits[0] < 3600
    assert "a manual run, random offset" in caplog.text
    assert "stopped during the jitter, before the run started: nothing to release" in caplog.text


def test_a_restarted_sidecar_waits_for_the_manual_instant_it_drew_first(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "run").mkdir()
    first, first_stop, _ = hold(tmp_path, clock, "--jitter", "1h", stop_at=1)
    assert first.run() == 0
    drawn = first_stop.waits[0]
    # The container restarts in the same pod 5s later (the fake wait moved the clock by
    # the whole wait: move it back to 5s after the first start).
    clock.advance(5 - drawn)
    again, again_stop, _ = hold(tmp_path, clock, "--jitter", "1h", stop_at=1)
    assert again.run() == 0
    assert again_stop.waits[0] == pytest.approx(drawn - 5, abs=1e-6)
    # A file it cannot read is drawn again, with a warning; the new draw is kept.
    (tmp_path / "run" / contract.JITTER_FILE).write_text("garbage\n")
    caplog.set_level("WARNING", logger="cronlock_sidecar.hold")
    third, third_stop, _ = hold(tmp_path, clock, "--jitter", "1h", stop_at=1)
    assert third.run() == 0
    assert "cannot read the jitter drawn before" in caplog.text
    start, offset = (tmp_path / "run" / contract.JITTER_FILE).read_text().split()
    assert 0 <= float(offset) < 3600
    # Drawn at its start: the fake clock has moved by the wait since.
    assert float(start) == pytest.approx(clock.now().timestamp() - float(offset), abs=1e-3)
    assert third_stop.waits[0] == pytest.approx(float(offset), abs=1e-6)


def test_hold_without_jitter_decides_at_once(tmp_path: Path, clock: FakeClock) -> None:
    holder, _, events = hold(tmp_path, clock)
    assert holder.run() == 0
    assert events[0] == "get"


# --- run ---------------------------------------------------------------------------------
STARTED = re.compile(r"jitter: the run starts in [0-9.]+s, at (\S+)Z ")


def stated_instant(err: str) -> float:
    match = STARTED.search(err)
    assert match is not None, err
    return datetime.fromisoformat(match.group(1) + "+00:00").timestamp()


def test_run_with_a_tick_starts_its_command_at_the_ticks_instant_not_before(
    api_server: FakeApiServer, sidecar_env: dict[str, str], tmp_path: Path
) -> None:
    # A tick a few seconds back whose instant (nominal + offset) is still 4-8s ahead, of
    # one of many names (one always has such a tick): the process starts well before it,
    # even on a loaded machine (5 helpers' tests beside a full run failed a 3-6s window).
    now = time.time()
    ticks = [datetime.fromtimestamp(int(now) - back, UTC) for back in range(20)]
    name, tick = next(
        (name, at)
        for name in (f"nightly-{index}" for index in range(100))
        for at in ticks
        if 4.0 <= at.timestamp() + tick_offset(name, at, 20) - now <= 8.0
    )
    expected = tick.timestamp() + tick_offset(name, tick, 20)
    started = tmp_path / "started"
    code, err = finish(
        start_run(
            sidecar_env, "--tick", format_tick(tick), "--tick-of", name, "--jitter", "20s",
            "--", "sh", "-c", f"date +%s.%N > {started}",
        )
    )  # fmt: skip
    assert code == 0, err
    assert stated_instant(err) == pytest.approx(expected, abs=0.001)
    assert f"(tick {format_tick(tick)} of {name}, offset " in err
    waited = re.search(r"jitter: the run starts in ([0-9.]+)s", err)
    assert waited is not None
    assert float(waited.group(1)) > 1, "started after the instant: nothing measured"
    began = float(started.read_text())
    # Not before the instant; after it, only the acquire and the command's start-up.
    assert expected <= began < expected + 2.0 + SLACK


def test_run_without_a_tick_starts_at_a_random_instant_within_the_jitter(
    api_server: FakeApiServer, sidecar_env: dict[str, str], tmp_path: Path
) -> None:
    started = tmp_path / "started"
    before = time.time()
    code, err = finish(
        start_run(sidecar_env, "--jitter", "2s", "--", "sh", "-c", f"date +%s.%N > {started}")
    )
    assert code == 0, err
    assert "(a manual run, random offset " in err
    instant = stated_instant(err)
    # Counted from the process's own start (its start-up, up to 2s on a loaded machine).
    assert before <= instant < before + 2 + 2.0
    assert instant <= float(started.read_text()) < instant + 2.0


def test_run_stopped_during_its_jitter_never_takes_the_lock(
    api_server: FakeApiServer, sidecar_env: dict[str, str]
) -> None:
    process = start_run(sidecar_env, "--jitter", "1h", "--", "true")
    assert process.stderr is not None
    lines: list[str] = []

    def read() -> None:
        assert process.stderr is not None
        lines.extend(process.stderr)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    wait_for(lambda: any("jitter: the run starts in" in line for line in lines))
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 128 + signal.SIGTERM
    reader.join(5)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()
    assert not [method for method, _ in api_server.requests if method in ("POST", "PUT")]
