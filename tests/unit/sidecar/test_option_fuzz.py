"""Sidecar options fuzzed over flags and their CRONLOCK_* twins: bad ones exit 78 untouched.

The oracle is built alongside each value (a value is drawn valid or invalid on purpose), so
it does not re-run the sidecar's parser; a valid set must parse to exactly those values, an
invalid one must exit 78 with a `cronlock-sidecar: ` line naming an option before any
request reaches the (counting) API server.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from contextlib import redirect_stderr
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronlock_sidecar.cli import main
from cronlock_sidecar.options import ENV_TWINS, ConfigError, Options, parse_options
from tests.unit.sidecar.fakes import FakeApiServer

FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
POD = {"CRONLOCK_POD_NAME": "report-1-x", "CRONLOCK_POD_UID": "3f2a9c1e-0000-4000-8000-0000"}


@dataclass
class Value:
    """One option's text and, when it is valid, what it means."""

    text: str
    meaning: float | str | None  # None: invalid


@st.composite
def durations(draw: st.DrawFn, low: float = 0.0, high: float = 7200.0) -> Value:
    """A Go duration of `low`..`high` seconds, built from parts (`1m30s`, `1.5s`, `250ms`)."""
    parts = draw(
        st.lists(
            st.tuples(
                st.one_of(
                    st.integers(0, 5000).map(str),
                    st.decimals(0, 100, places=2, allow_nan=False).map(lambda d: f"{d:f}"),
                ),
                st.sampled_from(sorted(UNITS)),
            ),
            min_size=1,
            max_size=3,
        )
    )
    seconds = sum(float(number) * UNITS[unit] for number, unit in parts)
    text = "".join(number + unit for number, unit in parts)
    if not low <= seconds <= high:
        return Value(text, None) if seconds < low else Value("1m", 60.0)
    return Value(text, seconds)


NOT_DURATIONS = st.sampled_from(
    ["abc", "-5s", "5", "1e3s", "s", "1.5", "5 s", "1d", "5S", "inf", "nan", "1h-5m", "+", "0x10s"]
).map(lambda text: Value(text, None)) | st.text(
    st.characters(codec="ascii", exclude_characters="0123456789."), min_size=1, max_size=6
).filter(lambda text: text.strip() not in {"", "0"}).map(lambda text: Value(text, None))

# What people write: ttl and renew from these often land near each other's limits.
COMMON_DURATIONS = st.sampled_from(
    [
        *[("500ms", 0.5), ("1s", 1.0), ("2s", 2.0), ("3s", 3.0), ("4s", 4.0), ("5s", 5.0)],
        *[("6s", 6.0), ("20s", 20.0), ("30s", 30.0), ("45s", 45.0), ("1m", 60.0), ("90s", 90.0)],
    ]
).map(lambda pair: Value(*pair))

names = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
leases = st.one_of(
    st.tuples(names, names).map(lambda pair: Value(f"{pair[0]}/{pair[1]}", "/".join(pair))),
    st.sampled_from(
        ["default", "/x", "x/", "Default/x", "a/b/c", "a_b/c", "-a/b", "a/B", " a/b", ""]
    ).map(lambda text: Value(text, None)),
    st.tuples(st.just("a" * 64), names).map(lambda pair: Value("/".join(pair), None)),
)


def choices(valid: list[str]) -> st.SearchStrategy[Value]:
    return st.one_of(
        st.sampled_from(valid).map(lambda text: Value(text, text)),
        st.sampled_from(["", "SKIP", "Skip ", "yes", "other", "debugg", "JSON"])
        .filter(lambda text: text not in valid)
        .map(lambda text: Value(text, None)),
    )


identities = st.one_of(
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40).map(
        lambda text: Value(text, text)
    ),
    st.sampled_from(["", "a b", "tab\there", "é", "x" * 254]).map(lambda text: Value(text, None)),
)
ports = st.one_of(
    st.integers(0, 65535).map(lambda port: Value(str(port), float(port))),
    st.sampled_from(["65536", "-1", "http", "80.0", "", "99999999"]).map(lambda t: Value(t, None)),
)


@dataclass
class Case:
    command: str
    flags: dict[str, Value] = field(default_factory=dict)
    twins: dict[str, Value] = field(default_factory=dict)

    def effective(self, key: str) -> Value | None:
        """The flag wins; an empty twin counts as unset."""
        if key in self.flags:
            return self.flags[key]
        twin = self.twins.get(key)
        return twin if twin is not None and twin.text != "" else None

    def argv(self) -> list[str]:
        argv = [self.command]
        for key, value in self.flags.items():
            argv.append(f"--{key.replace('_', '-')}={value.text}")
        return [*argv, "--", "true"] if self.command == "run" else argv

    def env(self) -> dict[str, str]:
        env = dict(POD) if self.command == "hold" else {}
        env.update({ENV_TWINS[key]: value.text for key, value in self.twins.items()})
        return env

    def expected(self) -> dict[str, float | str] | None:
        """What the options must parse to, or None when some option is bad."""
        values = {key: self.effective(key) for key in OPTIONS[self.command]}
        if any(value is not None and value.meaning is None for value in values.values()):
            return None
        meaning: dict[str, float | str] = {
            key: value.meaning
            for key, value in values.items()
            if value is not None and value.meaning is not None
        }
        if "lease" not in meaning:
            return None
        # The lock model's rule, in whole milliseconds: ttl at least 1s, and a renew
        # period (default a third of the ttl) of at most a third of the ttl.
        ttl_ms = round(float(meaning.get("ttl", 60.0)) * 1000)
        renew_ms = round(float(meaning["renew"]) * 1000) if "renew" in meaning else ttl_ms // 3
        policy = meaning.get("policy", "skip")
        wait_timeout = float(meaning.get("wait_timeout", 0.0))
        if ttl_ms < 1000 or renew_ms <= 0 or 3 * renew_ms > ttl_ms:
            return None
        if wait_timeout > 0 and policy != "wait":
            return None
        expected: dict[str, float | str] = {"ttl": ttl_ms / 1000, "renew": renew_ms / 1000}
        for key in ("lease", "policy", "identity", "log_format", "log_level"):
            if key in meaning:
                expected[key] = meaning[key]
        if "skew" in meaning:
            expected["skew"] = round(float(meaning["skew"]) * 1000) / 1000
        return expected


OPTION_VALUES: dict[str, st.SearchStrategy[Value]] = {
    "lease": leases,
    "ttl": COMMON_DURATIONS | durations(0.0, 600.0) | NOT_DURATIONS,
    "renew": COMMON_DURATIONS | durations(0.0, 600.0) | NOT_DURATIONS,
    "skew": durations() | NOT_DURATIONS,
    "kill_grace": durations() | NOT_DURATIONS,
    "wait_timeout": durations() | NOT_DURATIONS,
    "policy": choices(["skip", "wait"]),
    "identity": identities,
    "log_format": choices(["plain", "json"]),
    "log_level": choices(["debug", "info", "warning", "error"]),
    "port": ports,
}
COMMON = ["lease", "ttl", "renew", "skew", "kill_grace", "wait_timeout", "policy", "identity"]
OPTIONS = {
    "run": [*COMMON, "log_format", "log_level"],
    "hold": [*COMMON, "log_format", "log_level", "port"],
}


@st.composite
def cases(draw: st.DrawFn) -> Case:
    case = Case(draw(st.sampled_from(sorted(OPTIONS))))
    # Mostly valid, so both outcomes are well covered.
    case.flags["lease"] = draw(leases)
    for key in OPTIONS[case.command]:
        where = draw(st.sampled_from(["none", "none", "flag", "twin", "both"]))
        if where in {"flag", "both"}:
            case.flags[key] = draw(OPTION_VALUES[key])
        if where in {"twin", "both"}:
            case.twins[key] = draw(OPTION_VALUES[key])
    if draw(st.booleans()):
        del case.flags["lease"]
    return case


@pytest.fixture(scope="module")
def counting_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeApiServer]:
    """A Lease API server that records every request it is sent."""
    server = FakeApiServer(tmp_path_factory.mktemp("fuzz-api"))
    server.thread.start()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


def check_parsed(options: Options, expected: dict[str, float | str]) -> None:
    assert options.ttl == pytest.approx(expected["ttl"])
    assert options.renew == pytest.approx(expected["renew"])
    assert 0 < options.renew < options.ttl
    for key in ("policy", "identity", "log_format", "log_level"):
        if key in expected:
            assert getattr(options, key) == expected[key]
    if "skew" in expected:
        assert options.skew == pytest.approx(expected["skew"])
    assert options.lease is not None
    assert f"{options.lease.namespace}/{options.lease.name}" == expected["lease"]


@FUZZ
@given(case=cases())
def test_options_either_parse_to_what_was_given_or_exit_78_before_any_request(
    case: Case, counting_api: FakeApiServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    expected = case.expected()
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path_factory.getbasetemp()),
        "KUBECONFIG": str(counting_api.kubeconfig),
        **case.env(),
    }
    if expected is not None:
        check_parsed(parse_options(case.argv(), env), expected)
        return
    with pytest.raises(ConfigError):
        parse_options(case.argv(), env)
    before = len(counting_api.requests)
    stderr = io.StringIO()
    with redirect_stderr(stderr):
        assert main(case.argv(), env) == 78
    assert len(counting_api.requests) == before
    message = stderr.getvalue()
    assert message.startswith("cronlock-sidecar: "), message
    assert re.search(r"--[a-z-]+|CMD|argument", message), message


@FUZZ
@given(
    command=st.sampled_from(["run", "hold"]),
    ttl=COMMON_DURATIONS | durations(1.0, 600.0),
    renew=COMMON_DURATIONS | durations(0.001, 600.0),
)
def test_no_accepted_renew_period_makes_the_holder_give_up_before_its_first_renewal(
    command: str, ttl: Value, renew: Value
) -> None:
    """A renew period at or past the renew deadline (2/3 ttl) can never keep the Lease:
    every run would be stopped as `lost` at 2/3 of the ttl. Such options must exit 78,
    as the operator already refuses them for annotations."""
    case = Case(command, {"lease": Value("default/x", "default/x"), "ttl": ttl, "renew": renew})
    try:
        options = parse_options(case.argv(), case.env())
    except ConfigError:
        return
    assert options.renew < options.ttl * 2 / 3


def test_the_sharp_edge_the_fuzzer_found() -> None:
    """`--ttl 6s --renew 5s` was accepted: the first renewal is due at 5s, but the holder
    gives up at 4s, so every run was stopped and exited 70 (found by the property above
    with `--ttl 3s --renew 2s`)."""
    with pytest.raises(ConfigError, match="--renew"):
        parse_options(
            ["run", "--lease", "default/x", "--ttl", "6s", "--renew", "5s", "--", "true"], {}
        )


def test_the_counting_server_would_see_a_request(
    counting_api: FakeApiServer, tmp_path: Path
) -> None:
    """The 'no request' assertions above can fail: a valid run does reach the server."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "KUBECONFIG": str(counting_api.kubeconfig),
    }
    before = len(counting_api.requests)
    assert main(["run", "--lease", "default/fuzz-probe", "--ttl", "3s", "--", "true"], env) == 0
    assert len(counting_api.requests) > before
