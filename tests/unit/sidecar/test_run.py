"""`cronlock-sidecar run` end to end against a fake Lease API server, in real processes."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cronlock_sidecar.contract import ANNOTATION_LAST_HOLDER, DEFAULT_TTL_SECONDS
from cronlock_sidecar.lock.durations import format_duration
from cronlock_sidecar.lock.model import Timing

if TYPE_CHECKING:
    from tests.unit.sidecar.fakes import FakeApiServer

from tests.support.leases import make_lease
from tests.support.timing import at_once, at_renew_deadline
from tests.unit.sidecar.fakes import (
    finish,
    holder,
    run_sidecar,
    start_run,
    wait_for,
)


def test_run_passes_the_fencing_token_exits_with_cmd_status_and_releases(
    api_server: FakeApiServer, sidecar_env: dict[str, str], tmp_path: Path
) -> None:
    api_server.put_lease(make_lease(transitions=41))
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
    api_server.put_lease(make_lease("pod-a_11111111", renewed=renewed))
    marker = tmp_path / "ran"
    code, err = run_sidecar(sidecar_env, "--", "touch", str(marker))
    assert code == 75
    # The ages are wall-clock seconds since the Lease was written, so a loaded machine
    # may add one or two; what must hold is the holder, and ago + remaining == 60 s.
    line = re.search(
        r"already running: lease default/cronlock-report held by pod-a_11111111 "
        r"\(renewed (\d+)s ago, expires in (\d+)s\); skipping this run",
        err,
    )
    assert line, err
    ago, remaining = int(line[1]), int(line[2])
    assert 5 <= ago <= 15
    assert ago + remaining == 60
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
    # A ttl of 3 x SLACK leaves the slack between the renew deadline (4s) and the ttl.
    timing = Timing.of(6, 1)
    process = start_run(
        sidecar_env,
        "--ttl", format_duration(timing.ttl), "--renew", format_duration(timing.renew),
        "--kill-grace", "1s", "--", "sleep", "30",
    )  # fmt: skip
    wait_for(lambda: holder(api_server) != "")
    api_server.broken = True
    stopped = at_renew_deadline(timing, "run stops CMD (SIGTERM) and exits")
    code, err = finish(process, timeout=stopped.high)
    assert code == 70, err
    stopped.check(time.monotonic() - api_server.last_write())
    assert "renew failed" in err
    assert "lost" in err


def test_run_stops_cmd_at_once_when_another_holder_took_the_lease(
    api_server: FakeApiServer, sidecar_env: dict[str, str]
) -> None:
    process = start_run(sidecar_env, "--ttl", "30s", "--renew", "300ms", "--", "sleep", "30")
    wait_for(lambda: holder(api_server) != "")
    api_server.put_lease(make_lease("thief", transitions=99))
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
    at_once(
        "SIGTERM",
        "CMD got it and the Lease was released",
        instead_of=DEFAULT_TTL_SECONDS,
        alternative="the Lease left to expire",
    ).check(time.monotonic() - started)
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


@pytest.mark.parametrize("log_format", ["json"])
def test_json_logs_are_one_object_per_line(
    api_server: FakeApiServer, sidecar_env: dict[str, str], log_format: str
) -> None:
    import json

    code, err = run_sidecar(sidecar_env, "--log-format", log_format, "--", "true")
    assert code == 0
    records = [json.loads(line) for line in err.splitlines()]
    messages = [record["message"] for record in records]
    assert any(message.startswith("lease default/cronlock-report acquired") for message in messages)
    # The schema the operator's JSON lines share (tests/integration/test_operator_endpoints.py).
    for record in records:
        assert set(record) >= {"timestamp", "level", "logger", "message"}, record
        assert record["level"] in {"debug", "info", "warning", "error", "critical"}
        assert record["logger"].startswith("cronlock_sidecar")
