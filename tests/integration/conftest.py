"""Session fixtures of the integration ring beyond the control plane's: the lock stores."""

from __future__ import annotations

import subprocess
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


@pytest.fixture
def cleanup() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test started; whatever is still running at the end is killed, and each
    one's pipes are read and closed, so none is left to the garbage collector of a later
    test (whose run an unraisable ResourceWarning would then fail)."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.communicate()
