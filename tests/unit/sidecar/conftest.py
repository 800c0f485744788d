"""Fixtures for the sidecar's unit tests, over the fakes in tests/unit/sidecar/fakes.py."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cronlock_sidecar.holding.lease import LeaseKeeper
from cronlock_sidecar.lock.model import Timing
from tests.unit.sidecar.fakes import LEASE, FakeApiServer, FakeClock, FakeTransport


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def transport() -> FakeTransport:
    return FakeTransport()


@pytest.fixture
def make_keeper(clock: FakeClock, transport: FakeTransport) -> Callable[..., LeaseKeeper]:
    def make(
        identity: str = "pod-b_22222222", ttl: float = 60, renew: float = 20, job_name: str = ""
    ) -> LeaseKeeper:
        timing = Timing.of(ttl, renew, 2)
        return LeaseKeeper(transport, LEASE, identity, timing, clock, job_name)

    return make


# --- driving the sidecar as a real process ---------------------------------------------
@pytest.fixture
def api_server(tmp_path: Path) -> Iterator[FakeApiServer]:
    server = FakeApiServer(tmp_path)
    server.thread.start()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


@pytest.fixture
def sidecar_env(api_server: FakeApiServer, tmp_path: Path) -> dict[str, str]:
    """A clean environment pointing the sidecar at the fake API server."""
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "KUBECONFIG": str(api_server.kubeconfig),
    }


@pytest.fixture(autouse=True)
def _reset_sidecar_logging() -> Iterator[None]:
    """`main()` configures the sidecar's loggers; give every test the default again."""
    yield
    logger = logging.getLogger("cronlock_sidecar")
    logger.handlers.clear()
    logger.propagate = True
    logger.setLevel(logging.NOTSET)
