"""`run` outside Kubernetes names its tick: from a cron schedule (the latest schedule time at
or before its start, within --tick-window) or --tick, whose ticks (--tick-of) and its run id;
its command is told the tick, the one recorded before its claim, and whether it is manual."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cronlock_sidecar.cli import main
from cronlock_sidecar.lock import ticks
from cronlock_sidecar.options import ConfigError, Options, parse_options, tick_of_run
from tests.support.leases import make_lease
from tests.unit.sidecar.fakes import run_sidecar

if TYPE_CHECKING:
    from tests.unit.sidecar.fakes import FakeApiServer

RUN = ["run", "--lease", "default/cronlock-report"]
NOON = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def options(*args: str, env: dict[str, str] | None = None) -> Options:
    return parse_options([*RUN, "--identity", "vm-a", *args, "--", "true"], env or {})


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        # A cron firing at 12:00:00.4 and a slow machine starting at 12:00:59 name 12:00.
        ("2026-12-06T12:00:00.400+00:00", "2026-12-06T12:00:00Z"),
        ("2026-12-06T12:00:59+00:00", "2026-12-06T12:00:00Z"),
        ("2026-12-06T12:00:00+00:00", "2026-12-06T12:00:00Z"),
    ],
)
def test_the_schedule_names_the_latest_time_at_or_before_the_start(now: str, expected: str) -> None:
    tick = tick_of_run(options("--schedule", "*/5 * * * *"), at(now))
    assert tick == ticks.Tick("cronlock-report", at(expected), "", "vm-a")


def test_two_machines_whose_crons_fire_apart_name_the_same_tick() -> None:
    first = tick_of_run(
        options("--schedule", "0 * * * *", "--run-id", "a"), at("2026-12-06T12:00:00.2+00:00")
    )
    second = tick_of_run(
        options("--schedule", "0 * * * *", "--run-id", "b"), at("2026-12-06T12:00:41+00:00")
    )
    assert first is not None
    assert second is not None
    assert first.at == second.at == NOON
    assert (first.run, second.run) == ("a", "b")


def test_the_schedule_is_read_in_its_time_zone() -> None:
    # 03:00 in Berlin (winter, UTC+1) is 02:00 UTC.
    chosen = options("--schedule", "0 3 * * *", "--time-zone", "Europe/Berlin")
    tick = tick_of_run(chosen, at("2026-12-06T02:00:10+00:00"))
    assert tick is not None
    assert ticks.format_tick(tick.at) == "2026-12-06T02:00:00Z"
    with pytest.raises(ConfigError, match="no time of '0 3 \\* \\* \\*' \\(Europe/Berlin\\)"):
        tick_of_run(chosen, at("2026-12-06T03:00:10+00:00"))


def test_a_start_beyond_the_tick_window_is_refused_not_named_an_old_tick() -> None:
    with pytest.raises(ConfigError) as refused:
        tick_of_run(options("--schedule", "0 * * * *"), at("2026-12-06T12:01:01+00:00"))
    message = str(refused.value)
    assert message.startswith("--schedule: no time of '0 * * * *' within --tick-window 1m")
    assert "start it from cron at the schedule's times" in message
    # A wider window names the tick the run was late for.
    late = tick_of_run(
        options("--schedule", "0 * * * *", "--tick-window", "5m"), at("2026-12-06T12:04:00+00:00")
    )
    assert late is not None
    assert late.at == NOON


def test_a_named_tick_is_taken_as_given_unless_it_is_ahead_of_now() -> None:
    chosen = options("--tick", "2026-12-06T13:00:00+01:00", "--tick-of", "nightly")
    assert chosen.tick_at == NOON
    assert tick_of_run(chosen, at("2026-12-06T18:00:00+00:00")) == ticks.Tick(
        "nightly", NOON, "", "vm-a"
    )
    # Within the skew (default 2s) of now: the sender's clock may be a little ahead.
    assert tick_of_run(chosen, at("2026-12-06T11:59:58.5+00:00")) is not None
    with pytest.raises(ConfigError, match="--tick: 2026-12-06T12:00:00Z is ahead of now"):
        tick_of_run(chosen, at("2026-12-06T11:59:57+00:00"))


def test_without_a_schedule_or_a_tick_a_run_is_manual() -> None:
    chosen = options()
    assert (chosen.schedule, chosen.tick_at, chosen.tick_of, chosen.run_id) == ("", None, "", "")
    assert tick_of_run(chosen, NOON) is None


def test_whose_ticks_defaults_to_the_lock_name_and_the_run_id_to_the_identity() -> None:
    chosen = options("--schedule", "@hourly")
    assert (chosen.tick_of, chosen.run_id) == ("cronlock-report", "vm-a")
    shared = options("--schedule", "@hourly", "--tick-of", "nightly", "--run-id", "vm-a-1200")
    assert (shared.tick_of, shared.run_id) == ("nightly", "vm-a-1200")


def test_every_tick_option_has_its_environment_twin() -> None:
    chosen = options(
        env={
            "CRONLOCK_SCHEDULE": "30 2 * * *",
            "CRONLOCK_TIME_ZONE": "America/New_York",
            "CRONLOCK_TICK_WINDOW": "2m",
            "CRONLOCK_TICK_OF": "nightly",
            "CRONLOCK_RUN_ID": "vm-b-7",
        }
    )
    assert chosen.schedule == "30 2 * * *"
    assert chosen.time_zone == "America/New_York"
    assert chosen.tick_window == 120
    assert (chosen.tick_of, chosen.run_id) == ("nightly", "vm-b-7")
    named = options(env={"CRONLOCK_TICK_AT": "2026-12-06T12:00:00Z"})
    assert named.tick_at == NOON
    # The work's own CRONLOCK_TICK is not an input: a command under `run` running `run`
    # again does not claim its parent's tick unasked.
    assert options(env={"CRONLOCK_TICK": "2026-12-06T12:00:00Z"}).tick_at is None


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--schedule", "61 * * * *"],
            "--schedule: '61 * * * *' is not a schedule the CronJob controller (robfig/cron) "
            "accepts; expected five fields",
        ),
        (["--schedule", "@every 5m"], "--schedule: '@every 5m': @every counts from a CronJob"),
        (["--schedule", "0 0 30 2 *"], "--schedule: '0 0 30 2 *' never ticks"),
        (
            ["--schedule", "0 3 * * *", "--time-zone", "Europe/Berlinn"],
            "--time-zone: unknown time zone 'Europe/Berlinn'; expected an IANA name",
        ),
        (
            ["--schedule", "TZ=Mars/Olympus 0 3 * * *"],
            "--schedule: unknown time zone 'Mars/Olympus' in 'TZ=Mars/Olympus 0 3 * * *'",
        ),
        (
            ["--schedule", "TZ=UTC 0 3 * * *", "--time-zone", "UTC"],
            "--schedule: 'TZ=UTC 0 3 * * *' names its time zone already",
        ),
        (
            ["--schedule", "@hourly", "--tick", "2026-12-06T12:00:00Z"],
            "--schedule and --tick: both set; name the tick one way",
        ),
        (["--time-zone", "UTC"], "--time-zone: only meaningful with --schedule or --tick"),
        (["--tick-of", "nightly"], "--tick-of: only meaningful with --schedule or --tick"),
        (["--run-id", "r1"], "--run-id: only meaningful with --schedule or --tick"),
        (
            ["--tick", "2026-12-06T12:00:00Z", "--time-zone", "UTC"],
            "--time-zone: only meaningful with --schedule, not --tick",
        ),
        (["--tick", "tomorrow"], "--tick: 'tomorrow' is not a time; expected RFC 3339"),
        (
            ["--tick", "2026-12-06T12:00:00"],
            "--tick: '2026-12-06T12:00:00' has no date and time with an offset",
        ),
        (["--tick", "2026-12-06"], "--tick: '2026-12-06' has no date and time with an offset"),
        (
            ["--tick", "2026-12-06T12:00:00.5Z"],
            "--tick: '2026-12-06T12:00:00.5Z' has a fraction of a second",
        ),
        (
            ["--schedule", "@hourly", "--tick-window", "0s"],
            "--tick-window: 0s is out of range; expected 1s to 24h",
        ),
        (
            ["--schedule", "@hourly", "--tick-window", "25h"],
            "--tick-window: 25h is out of range",
        ),
        (
            ["--schedule", "@hourly", "--tick-of", "Nightly"],
            "--tick-of: 'Nightly' is not a CronJob's name",
        ),
        (
            ["--schedule", "@hourly", "--tick-of", "n" * 53],
            "is not a CronJob's name; expected lowercase letters, digits, '-' and '.', at most 52",
        ),
        (
            ["--schedule", "@hourly", "--run-id", "a b"],
            "--run-id: 'a b' is not a run id",
        ),
    ],
)
def test_bad_tick_options_are_refused_with_what_to_do(args: list[str], expected: str) -> None:
    with pytest.raises(ConfigError) as refused:
        options(*args)
    assert expected in str(refused.value)


def test_a_lock_name_that_is_no_cronjob_name_needs_tick_of() -> None:
    lease = "default/" + "l" * 60
    with pytest.raises(ConfigError, match=r"--tick-of: not set, and the lock's name 'l+' is no"):
        parse_options(["run", "--lease", lease, "--schedule", "@hourly", "--", "true"], {})
    chosen = parse_options(
        ["run", "--lease", lease, "--schedule", "@hourly", "--tick-of", "nightly", "--", "true"],
        {},
    )
    assert chosen.tick_of == "nightly"


def test_the_cli_exits_78_for_a_run_started_outside_its_tick_window(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # "0 0 1 1 *" ticks at New Year only, so any time but its first minutes is outside a
    # 60s window; the refusal comes before any request (no kubeconfig is needed).
    now = datetime.now(UTC)
    if now.month == 1 and now.day == 1 and now.hour == 0 and now.minute < 2:
        schedule = "0 0 1 7 *"
    else:
        schedule = "0 0 1 1 *"
    code = main([*RUN, "--schedule", schedule, "--", "true"], {"PATH": "/usr/bin:/bin"})
    assert code == 78
    assert f"--schedule: no time of '{schedule}' within --tick-window 1m" in capsys.readouterr().err


def test_run_tells_its_command_the_tick_and_the_one_recorded_before_its_claim(
    api_server: FakeApiServer, sidecar_env: dict[str, str], tmp_path: Path
) -> None:
    before = ticks.TickRecord("nightly", at("2025-06-01T11:00:00Z"), "", "vm-b", "vm-b", "")
    api_server.put_lease(make_lease(annotations={ticks.record_key("nightly"): before.text()}))
    told = tmp_path / "told"
    script = f'echo "$CRONLOCK_TICK|$CRONLOCK_PREVIOUS_TICK|$CRONLOCK_MANUAL" > {told}'
    code, err = run_sidecar(
        sidecar_env,
        "--identity",
        "vm-a",
        "--tick",
        "2025-06-01T12:00:00Z",
        "--tick-of",
        "nightly",
        "--",
        "sh",
        "-c",
        script,
    )
    assert code == 0, err
    assert told.read_text() == "2025-06-01T12:00:00Z|2025-06-01T11:00:00Z|false\n"
    assert (
        "run works tick 2025-06-01T12:00:00Z of nightly (run vm-a; previous tick on the "
        "lock: 2025-06-01T11:00:00Z; last successful tick: none)"
    ) in err


def test_a_far_future_record_is_no_previous_tick_and_a_manual_run_says_so(
    api_server: FakeApiServer, sidecar_env: dict[str, str], tmp_path: Path
) -> None:
    hostile = ticks.TickRecord("nightly", at("2126-01-01T00:00:00Z"), "", "x", "x", "")
    api_server.put_lease(make_lease(annotations={ticks.record_key("nightly"): hostile.text()}))
    told = tmp_path / "told"
    script = f'echo "$CRONLOCK_TICK|$CRONLOCK_PREVIOUS_TICK|$CRONLOCK_MANUAL" > {told}'
    code, err = run_sidecar(
        sidecar_env,
        "--tick",
        "2025-06-01T12:00:00Z",
        "--tick-of",
        "nightly",
        "--",
        "sh",
        "-c",
        script,
    )
    assert code == 0, err
    assert told.read_text() == "2025-06-01T12:00:00Z||false\n"
    code, err = run_sidecar(sidecar_env, "--", "sh", "-c", script)
    assert code == 0, err
    assert told.read_text() == "||true\n"


@pytest.mark.parametrize(("args", "imported"), [([], False), (["--schedule", "@hourly"], True)])
def test_the_cron_parser_is_imported_only_for_a_schedule(args: list[str], imported: bool) -> None:
    code = (
        "import sys\n"
        "from cronlock_sidecar.options import parse_options\n"
        f"parse_options({[*RUN, *args, '--', 'true']!r}, {{}})\n"
        "print('cronlock_sidecar.lock.schedule' in sys.modules, 'zoneinfo' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.split() == [str(imported), str(imported)]


def run_tick(env: dict[str, str], tick: str, run_id: str, script: str) -> tuple[int, str]:
    return run_sidecar(
        env, "--tick", tick, "--tick-of", "nightly", "--run-id", run_id, "--", "sh", "-c", script
    )


def test_a_tick_whose_command_exits_0_is_the_next_runs_last_success(
    api_server: FakeApiServer, sidecar_env: dict[str, str], tmp_path: Path
) -> None:
    api_server.put_lease(make_lease())
    told = tmp_path / "told"
    script = f'echo "$CRONLOCK_PREVIOUS_TICK|$CRONLOCK_LAST_SUCCESS_TICK" > {told}'
    code, err = run_tick(sidecar_env, "2025-06-01T11:00:00Z", "run-11", script)
    assert code == 0, err
    assert told.read_text() == "|\n"
    # 12:00 fails: claimed, but no success
    code, err = run_tick(sidecar_env, "2025-06-01T12:00:00Z", "run-12", f"{script}; exit 3")
    assert code == 3, err
    assert told.read_text() == "2025-06-01T11:00:00Z|2025-06-01T11:00:00Z\n"
    code, err = run_tick(sidecar_env, "2025-06-01T13:00:00Z", "run-13", script)
    assert code == 0, err
    assert told.read_text() == "2025-06-01T12:00:00Z|2025-06-01T11:00:00Z\n"
    lease = api_server.get_lease()
    assert lease is not None
    success = ticks.read_success(lease["metadata"]["annotations"], "nightly")
    assert success is not None
    assert (ticks.format_tick(success.at), success.run) == ("2025-06-01T13:00:00Z", "run-13")
    # a manual run (no tick) records no success of its own
    code, err = run_sidecar(sidecar_env, "--", "sh", "-c", script)
    assert code == 0, err
    lease = api_server.get_lease()
    assert lease is not None
    assert ticks.read_success(lease["metadata"]["annotations"], "nightly") == success
