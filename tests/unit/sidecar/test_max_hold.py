"""`--max-hold`: the bounds a value must keep, and `run` stopping its command at the bound."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

import pytest

from cronlock_sidecar.contract import ENV_MAX_HOLD, EXIT_MAX_HOLD
from cronlock_sidecar.lock.maxhold import exceeded_line, max_hold_problem, shortest_max_hold
from cronlock_sidecar.lock.model import Timing
from cronlock_sidecar.options import ConfigError, parse_options

if TYPE_CHECKING:
    from tests.unit.sidecar.fakes import FakeApiServer

from tests.unit.sidecar.fakes import finish, holder, start_run, wait_for

HOLD = ["hold", "--lease", "default/cronlock-report", "--identity", "me_12345678"]


def test_max_hold_defaults_to_no_bound_and_reads_its_flag_or_env_twin() -> None:
    assert parse_options([*HOLD], {}).max_hold == 0.0
    assert parse_options([*HOLD, "--max-hold", "5m"], {}).max_hold == 300.0
    assert parse_options([*HOLD], {ENV_MAX_HOLD: "1h"}).max_hold == 3600.0
    assert parse_options([*HOLD, "--max-hold", "0"], {}).max_hold == 0.0


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--max-hold", "10m", "--policy", "observe"], {}, "--max-hold: 10m cannot be used with"),
        (["--max-hold", "169h"], {}, "--max-hold: 169h is out of range; expected at most 168h"),
        # 400 digits: float() makes it inf, which is out of range too, never a crash.
        (["--max-hold", "9" * 400 + "h"], {}, "--max-hold: 999"),
        # ttl 60s, renew 20s: at least 40s.
        (["--max-hold", "39s"], {}, "--max-hold: 39s is shorter than 2 renew periods (40s"),
        ([], {ENV_MAX_HOLD: "1x"}, f"--max-hold (from {ENV_MAX_HOLD}): '1x' is not a duration"),
    ],
)
def test_a_bad_max_hold_is_refused_naming_it_and_what_is_expected(
    args: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_options([*HOLD, *args], env)
    assert str(refused.value).startswith(message)


def test_the_shortest_max_hold_is_two_renew_periods() -> None:
    timing = Timing.of(19, 5, 2)
    assert shortest_max_hold(timing) == 10.0
    assert max_hold_problem(10.0, timing, "skip") is None
    assert max_hold_problem(9.999, timing, "skip") is not None
    assert max_hold_problem(0.0, timing, "observe") is None  # no bound: any policy
    assert max_hold_problem(7 * 24 * 3600.0, timing, "wait") is None


def test_the_exceeded_line_names_the_hold_and_the_bound() -> None:
    assert exceeded_line(10.04, 10) == "max-hold exceeded: held 10s, bound 10s"
    assert exceeded_line(12.34, 10) == "max-hold exceeded: held 12.3s, bound 10s"
    assert exceeded_line(303.4, 300) == "max-hold exceeded: held 5m3s, bound 5m"


@pytest.mark.parametrize("ignores_sigterm", [False, True])
def test_run_stops_its_command_at_max_hold_releases_and_exits_76(
    api_server: FakeApiServer, sidecar_env: dict[str, str], ignores_sigterm: bool
) -> None:
    work = "trap '' TERM; sleep 60 & wait; sleep 60" if ignores_sigterm else "sleep 60"
    started = time.monotonic()
    process = start_run(
        sidecar_env,
        "--ttl", "6s", "--renew", "500ms", "--kill-grace", "1s", "--max-hold", "2s",
        "--", "sh", "-c", work,
    )  # fmt: skip
    wait_for(lambda: holder(api_server) != "")
    writes_at_acquire = api_server.writes()
    code, err = finish(process, timeout=15)
    took = time.monotonic() - started
    assert code == EXIT_MAX_HOLD, err
    # The bound, then SIGTERM (and SIGKILL after the 1s grace for a work that ignores it).
    assert 2.0 <= took < 2.0 + (1.0 if ignores_sigterm else 0.0) + 2.0, err
    line = re.search(r"max-hold exceeded: held ([0-9.]+)s, bound 2s", err)
    assert line is not None, err
    assert 2.0 <= float(line.group(1)) < 2.5
    # Renewed while it held (4 or so in 2s), then released once the command was gone.
    assert api_server.writes() >= writes_at_acquire + 3
    assert holder(api_server) == ""
