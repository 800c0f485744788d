"""TLS to the store (review L3): which URLs warn at start, and that the line says what to set."""

from __future__ import annotations

import pytest

from cronlock_sidecar import cli
from cronlock_sidecar.holding.outcomes import SystemClock
from cronlock_sidecar.options import parse_options
from cronlock_sidecar.pod import logs
from cronlock_sidecar.stores.url import parse_store_url, tls_warning

SECRET = "pa55-w0rd"  # noqa: S105 - a test value


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (f"redis://:{SECRET}@redis.store.svc:6379/0", "not TLS (redis://)"),
        (f"redis://app:{SECRET}@10.0.0.7/0", "use rediss://"),
        (f"rediss://:{SECRET}@redis.example:6380?ssl_cert_reqs=none", "ssl_cert_reqs=none"),
        (f"rediss://:{SECRET}@redis.example?ssl_check_hostname=false", "ssl_check_hostname"),
        (f"postgresql://cronlock:{SECRET}@db.example/locks", "sslmode=prefer, libpq's default"),
        (f"postgres://cronlock:{SECRET}@db.example/locks?sslmode=require", "(sslmode=require)"),
        (
            f"postgresql://cronlock@db.example/locks?sslmode=disable&password={SECRET}",
            "set sslmode=verify-full and sslrootcert=PATH",
        ),
        (f"postgresql://cronlock:{SECRET}@db.example/x?host=10.1.2.3", "sslmode=prefer"),
    ],
)
def test_a_store_reached_without_verified_tls_warns_with_what_to_set(
    url: str, expected: str
) -> None:
    store = parse_store_url(url, "--store")
    warning = tls_warning(store)
    assert warning is not None
    assert expected in warning
    assert warning.startswith(f"store {store.shown}: ")
    assert 'docs/STORES.md, "TLS to the store"' in warning
    assert SECRET not in warning


@pytest.mark.parametrize(
    "url",
    [
        f"rediss://:{SECRET}@redis.example:6380/0",
        f"rediss://:{SECRET}@redis.example:6380/0?ssl_ca_certs=/ca.pem&ssl_check_hostname=true",
        f"postgresql://cronlock:{SECRET}@db.example/locks?sslmode=verify-full&sslrootcert=/ca.crt",
        f"postgresql://cronlock:{SECRET}@db.example/locks?sslmode=verify-ca&sslrootcert=/ca.crt",
        f"postgresql://cronlock:{SECRET}@db.example/locks?sslrootcert=system",
        # No network path to listen on: loopback, a Unix socket.
        f"redis://:{SECRET}@127.0.0.1:6379/0",
        f"redis://:{SECRET}@localhost:6379/0",
        f"postgresql://cronlock:{SECRET}@[::1]:5432/locks",
        "postgresql:///locks?host=/var/run/postgresql",
    ],
)
def test_a_verified_or_local_store_does_not_warn(url: str) -> None:
    assert tls_warning(parse_store_url(url, "--store")) is None


@pytest.mark.parametrize(
    ("url", "warns"),
    [
        (f"redis://:{SECRET}@192.0.2.10:6379/0", True),
        (f"postgresql://cronlock:{SECRET}@192.0.2.10/locks", True),
        (f"rediss://:{SECRET}@192.0.2.10:6379/0", False),
    ],
)
def test_the_sidecar_says_it_once_when_it_opens_the_store(
    url: str, warns: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """The store's client is made (nothing connects yet) and one WARNING line, with the
    password masked, is on stderr; a verified URL adds no line."""
    logs.configure("plain", "info")
    options = parse_options(["run", "--lease", "ns/x", "--store", url, "--", "true"], {})
    transport = cli._transport(options, {}, SystemClock())
    assert not isinstance(transport, int)
    transport.close()
    lines = capsys.readouterr().err.splitlines()
    warnings = [line for line in lines if " WARNING " in line]
    assert len(warnings) == (1 if warns else 0), lines
    assert SECRET not in "\n".join(lines)
    if warns:
        assert "192.0.2.10" in warnings[0]
        assert "rewrite every lock" in warnings[0]
