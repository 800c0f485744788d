"""`cronlock status --read-stores` and `freeze --store-secret` lend nothing of the caller's
machine to the host a Secret names (security review L4): no PG* environment, password file,
client certificate or Kerberos ticket; Redis URLs ask for nothing of the caller's; stores
are read only when asked."""

from __future__ import annotations

import base64
import os
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import pq
from psycopg.conninfo import make_conninfo

from cronlock_operator.storeaccess import StoreAccessError, address, open_store
from cronlock_sidecar.stores.pgstore import PostgresLeaseStore
from cronlock_sidecar.stores.url import ISOLATING_LIBPQ, parse_store_url
from cronlock_sidecar.transport.seam import ApiError, LeaseRef
from tests.unit.status.objects import cronjob
from tests.unit.status.test_cli import FakeApi, Handler, kubeconfig, run

# A closed port on loopback: libpq resolves every parameter and fails at once.
URL = "postgresql://cronlock@127.0.0.1:1/locks"
LEAKED = "admins-s3cret"


@pytest.fixture
def admins_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What an admin's shell may hold: a password, a password file and a service file
    with a password, a client certificate, a user name, a service to use."""
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"*:*:*:*:{LEAKED}\n")
    passfile.chmod(0o600)
    services = tmp_path / "pg_service.conf"
    services.write_text(f"[prod]\nuser=admin\npassword={LEAKED}\n")
    certificate = tmp_path / "postgresql.crt"
    certificate.write_text("not used\n")
    for name, value in {
        "PGPASSWORD": LEAKED,
        "PGPASSFILE": str(passfile),
        "PGSERVICEFILE": str(services),
        "PGSERVICE": "prod",
        "PGSSLCERT": str(certificate),
        "PGSSLKEY": str(certificate),
        "PGUSER": "admin",
        "PGREQUIREAUTH": "gss",
    }.items():
        monkeypatch.setenv(name, value)


class Probe:
    """psycopg.connect as libpq sees it: the parameters it resolves (PQconninfo after
    PQconnectStart, environment included) and the PG* variables visible meanwhile."""

    def __init__(self) -> None:
        self.parameters: dict[str, str | None] = {}
        self.environment: dict[str, str] = {}

    def __call__(self, conninfo: str, **kwargs: Any) -> None:
        kwargs.pop("autocommit", None)
        connection = pq.PGconn.connect_start(make_conninfo(conninfo, **kwargs).encode())
        self.parameters = {
            option.keyword.decode(): None if option.val is None else option.val.decode()
            for option in connection.info
        }
        connection.finish()
        self.environment = {k: v for k, v in os.environ.items() if k.startswith("PG")}
        raise psycopg.OperationalError("probe: not connecting")


def connect_through(store: Any, monkeypatch: pytest.MonkeyPatch) -> Probe:
    probe = Probe()
    monkeypatch.setattr(psycopg, "connect", probe)
    with pytest.raises(ApiError, match="probe: not connecting"):
        store.get(LeaseRef("team", "cronlock-ledger"))
    return probe


def now() -> datetime:
    return datetime.now(UTC)


@pytest.mark.usefixtures("admins_environment")
def test_the_callers_libpq_defaults_never_reach_a_store_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = open_store(parse_store_url(URL, "Secret team/locks"), read_only=True)
    seen = connect_through(store, monkeypatch)

    assert seen.environment == {}
    assert seen.parameters["password"] is None
    assert seen.parameters["user"] == "cronlock"  # the URL's, not PGUSER
    assert seen.parameters["service"] is None
    assert seen.parameters["sslcert"] is None
    assert seen.parameters["sslkey"] is None
    assert seen.parameters["passfile"] == "/dev/null/pgpass"
    assert seen.parameters["sslcertmode"] == "disable"
    assert seen.parameters["gssencmode"] == "disable"
    assert seen.parameters["require_auth"] == "scram-sha-256,md5,password,none"
    assert LEAKED not in repr(seen.parameters)
    # The caller's environment is as it was once the connection is made.
    assert os.environ["PGPASSWORD"] == LEAKED


@pytest.mark.usefixtures("admins_environment")
def test_the_same_connection_not_isolated_would_lend_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the probe sees of a connection that is not isolated (the sidecar's, whose
    environment is the pod's): the test above can fail."""
    store = PostgresLeaseStore(parse_store_url(URL, "--store"), now)
    seen = connect_through(store, monkeypatch)
    assert seen.parameters["password"] == LEAKED
    assert seen.parameters["sslcert"] is not None
    assert seen.environment["PGPASSWORD"] == LEAKED


def test_a_url_with_its_own_password_keeps_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPASSWORD", LEAKED)
    url = "postgresql://cronlock:its-own@127.0.0.1:1/locks?sslmode=verify-full&sslrootcert=/ca"
    seen = connect_through(open_store(parse_store_url(url, "x"), read_only=True), monkeypatch)
    assert (seen.parameters["password"], seen.parameters["sslmode"]) == ("its-own", "verify-full")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://cronlock@db.example/x?service=prod", "asks for service"),
        ("postgresql://cronlock@db.example/x?sslkeylogfile=/tmp/keys", "asks for sslkeylogfile"),
        ("postgresql://cronlock@/x?host=/var/run/postgresql", "names no TCP host"),
        ("postgresql://cronlock@/x", "names no TCP host"),
        ("postgresql://db.example/x", "names no user; cronlock does not lend yours"),
        ("rediss://:pw@redis.example/0?ssl_certfile=/home/admin/.redis.crt", "ssl_certfile"),
        ("redis://:pw@redis.example/0?ssl_keyfile=/k&socket_timeout=900", "socket_timeout"),
    ],
)
def test_a_url_asking_for_what_is_the_callers_is_refused_before_connecting(
    url: str, expected: str
) -> None:
    with pytest.raises(StoreAccessError, match=expected) as refused:
        open_store(parse_store_url(url, "Secret team/locks"), read_only=True)
    assert ":pw@" not in str(refused.value)


@pytest.mark.parametrize(
    "url",
    [
        "rediss://:pw@redis.example:6380/0?ssl_ca_certs=/ca.pem&ssl_check_hostname=true",
        "redis://:pw@10.0.0.7/0?db=3&protocol=3",
        "postgresql://cronlock:pw@db.example/x?sslmode=verify-full&sslrootcert=system",
        "postgresql://cronlock:pw@db.example,db2.example/x",
    ],
)
def test_a_url_that_names_only_its_own_things_is_opened(url: str) -> None:
    open_store(parse_store_url(url, "x"), read_only=True).close()


@pytest.mark.parametrize(("read_only", "create_tables"), [(True, False), (False, True)])
def test_postgres_is_opened_isolated_creating_tables_only_to_write(
    read_only: bool, create_tables: bool
) -> None:
    store = open_store(parse_store_url(URL, "x"), read_only=read_only)
    assert isinstance(store, PostgresLeaseStore)
    assert (store.create_tables, store.isolated) == (create_tables, True)
    store.close()


@pytest.mark.parametrize(
    ("url", "client"),
    [
        ("redis://:pw@10.0.0.7/0", "cronlock_sidecar.stores.redisstore"),
        (URL, "cronlock_sidecar.stores.pgstore"),
    ],
)
def test_a_store_whose_client_is_not_installed_says_how_to_install_it(
    url: str, client: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, client, None)  # importing it raises ImportError
    with pytest.raises(StoreAccessError, match=r"client is not installed \(pip install"):
        open_store(parse_store_url(url, "x"), read_only=True)


def test_a_libpq_older_than_isolation_needs_is_refused_before_connecting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """sslcertmode and require_auth, which keep the caller's client certificate and Kerberos
    ticket at home, need libpq 16: with an older one the store is not opened at all, and
    the message says what to install; the libpq that has them opens it."""
    monkeypatch.setattr(pq, "version", lambda: ISOLATING_LIBPQ - 1)
    with pytest.raises(StoreAccessError, match=r"needs libpq 16 or later.*psycopg\[binary\]"):
        open_store(parse_store_url(URL, "x"), read_only=True)
    monkeypatch.setattr(pq, "version", lambda: ISOLATING_LIBPQ)
    open_store(parse_store_url(URL, "x"), read_only=True).close()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://:pw@10.0.0.7/0", "10.0.0.7:6379"),
        ("rediss://:pw@[fd00::7]:6380/0", "[fd00::7]:6380"),
        ("postgresql://u:pw@db.example/x", "db.example:5432"),
        ("postgresql://u:pw@db.example/x?host=10.1.2.3&port=6432", "10.1.2.3:6432"),
        ("postgresql://u:pw@db.example/x?hostaddr=10.9.9.9", "10.9.9.9:5432"),
    ],
)
def test_the_address_said_before_connecting_is_where_the_client_goes(
    url: str, expected: str
) -> None:
    assert address(parse_store_url(url, "x")) == expected


def stored_cronjob() -> dict[str, Any]:
    item = cronjob("ledger", "team-a")
    item["metadata"]["annotations"].update(
        {"cronlock.io/store": "redis", "cronlock.io/store-secret": "team-locks"}
    )
    return item


class SecretHandler(Handler):
    """The fake API, also answering GET of Secret team-locks with a Redis URL."""

    def do_GET(self) -> None:
        if "/secrets/" not in self.path:
            super().do_GET()
            return
        self.server.paths.append(self.path)
        url = base64.b64encode(b"redis://:pw@127.0.0.1:1/0").decode()
        self.reply(
            200,
            {"kind": "Secret", "apiVersion": "v1", "metadata": {"name": "team-locks"},
             "data": {"url": url}},
        )  # fmt: skip


@pytest.fixture
def secret_api(tmp_path: Path) -> Iterator[tuple[FakeApi, Path]]:
    server = FakeApi(("127.0.0.1", 0), SecretHandler)
    server.objects = {"cronjobs": [stored_cronjob()], "leases": []}
    server.paths = []
    server.headers = []
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    yield server, kubeconfig(tmp_path / "config", f"http://{host!s}:{port}", "team-a")
    server.shutdown()
    server.server_close()


def test_stores_are_read_only_with_read_stores(
    capsys: pytest.CaptureFixture[str], secret_api: tuple[FakeApi, Path]
) -> None:
    server, config = secret_api
    code, out, err = run(capsys, "status", "--kubeconfig", str(config), "-o", "json")
    assert code == 0, err
    assert not [path for path in server.paths if "/secrets/" in path]
    assert '"state": "in-store"' in out
    assert err.splitlines() == [
        "cronlock: 1 lock in Redis or PostgreSQL not read (in-store): add --read-stores to "
        "read them, with your credentials, from the hosts their Secrets name"
    ]

    code, again, err = run(
        capsys, "status", "--kubeconfig", str(config), "-o", "json", "--read-stores"
    )
    assert [path for path in server.paths if "/secrets/" in path] == [
        "/api/v1/namespaces/team-a/secrets/team-locks"
    ]
    lines = err.splitlines()
    assert lines[0] == (
        "cronlock: reading team-a/cronlock-ledger (redis) from redis at 127.0.0.1:1 "
        "(Secret team-a/team-locks)"
    )
    assert "team-a/cronlock-ledger (redis): holder not shown:" in lines[1]
    assert ":pw@" not in err
    assert again == out  # the same JSON: nothing could be read at 127.0.0.1:1


def test_read_stores_with_watch_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], secret_api: tuple[FakeApi, Path]
) -> None:
    _server, config = secret_api
    code, _out, err = run(capsys, "status", "--kubeconfig", str(config), "-w", "--read-stores")
    assert code == 2
    assert "--read-stores: --watch never reads stores" in err
