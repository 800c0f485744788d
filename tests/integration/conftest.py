"""Session fixtures of the integration ring beyond the control plane's: the lock stores."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.stores import PostgresServer, RedisServer, running


@pytest.fixture(scope="session")
def redis_store() -> Iterator[RedisServer]:
    with running("redis") as server:
        assert isinstance(server, RedisServer)
        yield server


@pytest.fixture(scope="session")
def postgres_store() -> Iterator[PostgresServer]:
    with running("postgres") as server:
        assert isinstance(server, PostgresServer)
        yield server
