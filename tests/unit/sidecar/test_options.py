"""Every option is validated, with a message a user can act on, before any API request."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from cronlock_sidecar.cli import main
from cronlock_sidecar.options import parse_options

if TYPE_CHECKING:
    from tests.unit.sidecar.fakes import FakeApiServer

POD = {
    "CRONLOCK_POD_NAME": "report-29001-x7k2p",
    "CRONLOCK_POD_UID": "3f2a9c1e-0000-4000-8000-000000000000",
}


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (
            ["run", "--lease", "default/x", "--ttl", "abc", "--", "true"],
            {},
            "--ttl: 'abc' is not a duration; expected a Go duration",
        ),
        (
            ["run", "--lease", "default/x", "--ttl", "500ms", "--", "true"],
            {},
            "--ttl: must be at least 1s",
        ),
        (
            ["run", "--lease", "default/x", "--ttl=-5s", "--", "true"],
            {},
            "--ttl: '-5s' is not a duration",
        ),
        (
            ["run", "--lease", "default/x", "--ttl", "30s", "--renew", "30s", "--", "true"],
            {},
            "--renew: is too long for a ttl of 30s",
        ),
        (
            ["run", "--lease", "default/x", "--renew", "0s", "--", "true"],
            {},
            "--renew: must be more than 0s",
        ),
        (
            ["run", "--lease", "default/x", "--", "true"],
            {"CRONLOCK_TTL": "1 minute"},
            "--ttl (from CRONLOCK_TTL): '1 minute' is not a duration",
        ),
        (
            ["run", "--lease", "default/x", "--policy", "block", "--", "true"],
            {},
            "--policy: 'block' is not one of skip, wait",
        ),
        (
            ["run", "--lease", "default/x", "--wait-timeout", "5m", "--", "true"],
            {},
            "--wait-timeout: only meaningful with --policy wait",
        ),
        (
            [
                "run",
                "--lease",
                "default/x",
                "--policy",
                "wait",
                "--wait-timeout",
                "soon",
                "--",
                "true",
            ],
            {},
            "--wait-timeout: 'soon' is not a duration",
        ),
        (
            ["run", "--lease", "x", "--", "true"],
            {},
            "--lease: 'x' is not a Lease reference; expected NAMESPACE/NAME",
        ),
        (
            ["run", "--lease", "Default/x", "--", "true"],
            {},
            "--lease: namespace 'Default' is not a DNS-1123 label",
        ),
        (
            ["run", "--lease", "default/x_y", "--", "true"],
            {},
            "--lease: name 'x_y' is not a DNS-1123 subdomain",
        ),
        (["run", "--", "true"], {}, "--lease: required; expected NAMESPACE/NAME"),
        (["run", "--lease", "default/x"], {}, "CMD: missing"),
        (
            ["run", "--lease", "default/x", "--identity", "has space", "--", "true"],
            {},
            "--identity: 'has space' is not an identity",
        ),
        (
            ["run", "--lease", "default/x", "--skew", "2 s", "--", "true"],
            {},
            "--skew: '2 s' is not a duration",
        ),
        (
            ["run", "--lease", "default/x", "--kill-grace", "x", "--", "true"],
            {},
            "--kill-grace: 'x' is not a duration",
        ),
        (
            ["run", "--lease", "default/x", "--log-format", "xml", "--", "true"],
            {},
            "--log-format: 'xml' is not one of plain, json",
        ),
        (
            ["run", "--lease", "default/x", "--bogus", "--", "true"],
            {},
            "unrecognized arguments: --bogus",
        ),
        (
            ["hold", "--lease", "default/x"],
            {},
            "--identity: not set, and CRONLOCK_POD_NAME/CRONLOCK_POD_UID",
        ),
        (
            ["hold", "--lease", "default/x", "--port", "http"],
            POD,
            "--port: 'http' is not a TCP port; expected 0-65535",
        ),
        (
            ["hold", "--lease", "default/x", "--port", "70000"],
            POD,
            "--port: '70000' is not a TCP port",
        ),
        (
            ["hold", "--lease", "default/x", "--stop", "kill"],
            POD,
            "--stop: 'kill' is not one of auto, liveness, signal",
        ),
        (
            ["hold"],
            {**POD, "CRONLOCK_LEASE": "default"},
            "--lease (from CRONLOCK_LEASE): 'default' is not a Lease reference",
        ),
        (
            ["gate"],
            {"CRONLOCK_WAIT_TIMEOUT": "forever"},
            "--wait-timeout (from CRONLOCK_WAIT_TIMEOUT): 'forever' is not a duration",
        ),
        ([], {}, "the following arguments are required: command"),
    ],
)
def test_bad_input_exits_78_naming_the_option_without_touching_the_api(
    argv: list[str],
    env: dict[str, str],
    expected: str,
    sidecar_env: dict[str, str],
    api_server: FakeApiServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(argv, {**sidecar_env, **env}) == 78
    err = capsys.readouterr().err
    assert err.startswith("cronlock-sidecar: ")
    assert expected in err
    assert api_server.requests == []


def test_flags_win_over_environment_twins() -> None:
    options = parse_options(
        ["run", "--lease", "ops/from-flag", "--ttl", "90s", "--", "true"],
        {"CRONLOCK_LEASE": "ops/from-env", "CRONLOCK_TTL": "10s", "CRONLOCK_RENEW": "5s"},
    )
    assert str(options.lease) == "ops/from-flag"
    assert options.ttl == 90
    assert options.renew == 5


def test_defaults_follow_the_design() -> None:
    options = parse_options(["run", "--lease", "ops/report", "--", "echo", "hi"], {})
    assert options.ttl == 60
    assert options.renew == 20
    assert options.skew == 2
    assert options.policy == "skip"
    assert options.wait_timeout == 0
    assert options.timing.renew_deadline == pytest.approx(40)
    assert options.cmd == ("echo", "hi")


def test_renew_defaults_to_a_third_of_the_ttl() -> None:
    options = parse_options(["run", "--lease", "ops/report", "--ttl", "9s", "--", "true"], {})
    assert options.renew == 3


def test_command_arguments_after_double_dash_are_not_ours() -> None:
    options = parse_options(
        ["run", "--lease", "ops/report", "--", "sh", "-c", "exit 3", "--ttl", "x"], {}
    )
    assert options.cmd == ("sh", "-c", "exit 3", "--ttl", "x")
    assert options.ttl == 60


def test_hold_identity_is_pod_name_and_uid_prefix() -> None:
    options = parse_options(["hold", "--lease", "ops/report"], POD)
    assert options.identity == "report-29001-x7k2p_3f2a9c1e"


def test_run_identity_is_unique_per_process() -> None:
    first = parse_options(["run", "--lease", "ops/report", "--", "true"], {})
    second = parse_options(["run", "--lease", "ops/report", "--", "true"], {})
    assert first.identity != second.identity
    assert first.identity.count("_") >= 2


def test_explicit_identity_wins() -> None:
    options = parse_options(["hold", "--lease", "ops/report", "--identity", "me"], POD)
    assert options.identity == "me"
