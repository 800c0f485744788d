"""The one door to the lock's transports (stores/open.py): the client for the store a URL
names, or the Lease's on the API server, made without connecting, with the store's package
imported only when it is chosen."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cronlock_sidecar.stores import pgstore
from cronlock_sidecar.stores.open import open_store, open_transport
from cronlock_sidecar.stores.pgstore import PostgresLeaseStore
from cronlock_sidecar.stores.redisstore import RedisLeaseStore
from cronlock_sidecar.stores.url import ISOLATING_LIBPQ, parse_store_url
from cronlock_sidecar.transport.kubeapi import KubeLeaseClient
from cronlock_sidecar.transport.kubeconfig import KubeConfigError
from tests.unit.sidecar.test_kubeconfig import write_kubeconfig

# Closed ports on loopback: nothing is listening, and nothing must try.
REDIS = "redis://:pw@127.0.0.1:1/0"
POSTGRES = "postgresql://cronlock:pw@127.0.0.1:1/locks"


def now() -> datetime:
    return datetime.now(UTC)


@pytest.mark.parametrize("url", [REDIS, "rediss://:pw@redis.example:6380/0"])
def test_a_redis_url_gets_the_redis_client(url: str) -> None:
    store = open_store(parse_store_url(url, "--store"), now, 2.5)
    try:
        assert type(store) is RedisLeaseStore
        assert store.url.secret == url
        assert store.now is now
        kwargs = store.client.connection_pool.connection_kwargs
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (2.5, 2.5)
    finally:
        store.close()


@pytest.mark.parametrize("url", [POSTGRES, "postgres://cronlock@db.example:5433/locks"])
def test_a_postgres_url_gets_the_postgres_client_creating_its_tables_not_isolated(
    url: str,
) -> None:
    store = open_store(parse_store_url(url, "--store"), now, 2.5)
    assert type(store) is PostgresLeaseStore
    assert (store.url.secret, store.now, store.timeout) == (url, now, 2.5)
    assert (store.create_tables, store.isolated) == (True, False)
    store.close()


@pytest.mark.parametrize(
    ("create_tables", "isolated"), [(False, True), (True, True), (False, False)]
)
def test_the_postgres_client_gets_create_tables_and_isolated_as_asked(
    create_tables: bool, isolated: bool
) -> None:
    store = open_store(
        parse_store_url(POSTGRES, "x"), now, 5.0, create_tables=create_tables, isolated=isolated
    )
    assert type(store) is PostgresLeaseStore
    assert (store.create_tables, store.isolated) == (create_tables, isolated)
    store.close()


def test_redis_takes_the_postgres_only_arguments_and_connects_nowhere() -> None:
    store = open_store(parse_store_url(REDIS, "x"), now, 5.0, create_tables=False, isolated=True)
    assert type(store) is RedisLeaseStore
    store.close()


def test_the_isolating_libpq_is_the_one_pgstore_names() -> None:
    assert ISOLATING_LIBPQ == 160000
    assert pgstore.ISOLATING_LIBPQ is ISOLATING_LIBPQ


def imported_after(code: str) -> set[str]:
    """The modules a fresh interpreter has after running `code`."""
    script = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))\n"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    return set(json.loads(result.stdout))


def clients(loaded: set[str]) -> list[str]:
    names = (
        "redis",
        "psycopg",
        "cronlock_sidecar.stores.redisstore",
        "cronlock_sidecar.stores.pgstore",
    )
    return sorted(m for m in loaded if any(m == n or m.startswith(n + ".") for n in names))


OPEN = (
    "from datetime import datetime\n"
    "from cronlock_sidecar.stores.url import parse_store_url\n"
    "from cronlock_sidecar.stores.open import open_store\n"
    "open_store(parse_store_url({url!r}, 'x'), datetime.now, 1.0).close()\n"
)


def test_the_door_imports_no_store_client_until_one_is_chosen() -> None:
    loaded = imported_after("import cronlock_sidecar.stores.open")
    assert clients(loaded) == []


@pytest.mark.parametrize(
    ("url", "chosen", "not_imported"),
    [
        (REDIS, "cronlock_sidecar.stores.redisstore", ["psycopg", "pgstore"]),
        (POSTGRES, "cronlock_sidecar.stores.pgstore", ["redis", "redisstore"]),
    ],
)
def test_opening_a_store_imports_that_stores_client_only(
    url: str, chosen: str, not_imported: list[str]
) -> None:
    loaded = clients(imported_after(OPEN.format(url=url)))
    assert chosen in loaded
    assert not [m for m in loaded if any(part in m.split(".") for part in not_imported)]


def test_without_a_store_the_door_opens_the_lease_on_the_api_server_kubeconfig_names(
    tmp_path: Path,
) -> None:
    config = write_kubeconfig(
        tmp_path / "config", {"server": "https://127.0.0.1:1"}, {"token": "t0ken"}
    )
    transport = open_transport(None, {"KUBECONFIG": str(config)}, now, 2.5)
    try:
        assert type(transport) is KubeLeaseClient
        assert (transport.cluster.server, transport.cluster.namespace) == (
            "https://127.0.0.1:1",
            "ops",
        )
        assert transport.timeout == 2.5
    finally:
        transport.close()


def test_without_a_store_or_an_api_server_the_door_says_what_to_fix(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(KubeConfigError, match="nowhere"):
        open_transport(None, {"KUBECONFIG": str(missing), "HOME": str(tmp_path)}, now, 2.5)


def test_with_a_store_the_door_reads_no_kubeconfig(tmp_path: Path) -> None:
    """A broken $KUBECONFIG is no matter to a store lock: the door never reads it."""
    env = {"KUBECONFIG": str(tmp_path / "nowhere")}
    store = open_transport(parse_store_url(REDIS, "--store"), env, now, 2.5)
    try:
        assert type(store) is RedisLeaseStore
        assert store.url.secret == REDIS
    finally:
        store.close()
    postgres = open_transport(parse_store_url(POSTGRES, "--store"), env, now, 2.5)
    assert type(postgres) is PostgresLeaseStore
    assert (postgres.create_tables, postgres.isolated) == (True, False)


def test_the_lease_door_imports_no_store_client() -> None:
    loaded = imported_after(
        "from cronlock_sidecar.stores.open import open_transport\n"
        "from datetime import datetime\n"
        "try:\n"
        "    open_transport(None, {'KUBECONFIG': '/nonexistent'}, datetime.now, 1.0)\n"
        "except Exception:\n"
        "    pass\n"
    )
    assert "cronlock_sidecar.stores.open" in loaded
    assert "cronlock_sidecar.transport.kubeconfig" in loaded
    assert clients(loaded) == []
