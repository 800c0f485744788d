"""The lock in Redis and PostgreSQL, on real servers started by the tests (tests/support/stores.py).

Each test runs against both stores: `cronlock-sidecar run --store` as a user runs it, and
the transports' compare-and-set and fencing directly where a test needs to reach behind
the command (deleting a lock by hand, as an admin might).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import psycopg
import pytest
import redis

from cronlock_sidecar.lock.model import Timing, claimed, read_lease, renewed
from cronlock_sidecar.transport.pgstore import PostgresLeaseStore
from cronlock_sidecar.transport.redisstore import RedisLeaseStore, keys
from cronlock_sidecar.transport.seam import Conflict, LeaseRef, NotFound, Unavailable
from cronlock_sidecar.transport.storeurl import parse_store_url
from tests.reliability.checker import ROOT, SIDECAR

STORES = ("redis", "postgres")


class Server(Protocol):
    url: str

    def pause(self) -> None: ...

    def resume(self) -> None: ...


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> Iterator[tuple[str, Server]]:
    server: Server = request.getfixturevalue(f"{request.param}_store")
    yield request.param, server
    server.resume()


def lock_name(request: pytest.FixtureRequest) -> str:
    name = request.node.name.replace("[", "-").replace("]", "").replace("_", "-").lower()
    return f"tests/{name}-{os.getpid()}"


def start_run(
    url: str,
    lock: str,
    cmd: list[str],
    *extra: str,
    skewed: float | None = None,
) -> subprocess.Popen[str]:
    prefix = [str(SIDECAR)]
    env = {**os.environ, "CRONLOCK_STORE": url}
    if skewed is not None:
        prefix = [sys.executable, "-m", "tests.reliability.skewed", f"{skewed:+.1f}"]
        env["PYTHONPATH"] = str(ROOT)
    env.pop("KUBECONFIG", None)
    return subprocess.Popen(
        [*prefix, "run", "--lease", lock, *extra, "--", *cmd],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_line(path: Path, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.05)
    raise AssertionError(f"{path} stayed empty for {timeout}s")


def test_one_run_holds_the_other_skips_with_one_line(
    store: tuple[str, Server], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    _, server = store
    lock = lock_name(request)
    started = tmp_path / "started"
    holder = start_run(
        server.url,
        lock,
        ["sh", "-c", f'echo "$CRONLOCK_FENCING_TOKEN" > {started}; sleep 3'],
        "--ttl",
        "6s",
    )
    first_token = int(wait_for_line(started))
    second = start_run(server.url, lock, ["sh", "-c", "echo SECOND RAN"], "--ttl", "6s")
    out, err = second.communicate(timeout=30)
    assert second.returncode == 75, err
    assert "SECOND RAN" not in out
    skip_lines = [line for line in err.splitlines() if "already running" in line]
    assert len(skip_lines) == 1, err
    holder.communicate(timeout=30)
    assert holder.returncode == 0
    after = tmp_path / "after"
    third = start_run(server.url, lock, ["sh", "-c", f'echo "$CRONLOCK_FENCING_TOKEN" > {after}'])
    third.communicate(timeout=30)
    assert third.returncode == 0
    assert int(after.read_text()) > first_token


def test_a_client_clock_far_ahead_cannot_take_a_live_lock(
    store: tuple[str, Server], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The store's clock judges age: a contender 30s ahead (over ttl + skew) still skips.

    On the Lease, each reader judges renewTime on its own clock, so this contender would
    take the lock over (the checker's clock-ahead fault, outside the Lease's guarantee).
    """
    _, server = store
    lock = lock_name(request)
    started = tmp_path / "started"
    holder = start_run(
        server.url, lock, ["sh", "-c", f"echo up > {started}; sleep 4"], "--ttl", "6s"
    )
    wait_for_line(started)
    ahead = start_run(server.url, lock, ["sh", "-c", "echo AHEAD RAN"], "--ttl", "6s", skewed=30.0)
    out, err = ahead.communicate(timeout=30)
    assert ahead.returncode == 75, err
    assert "AHEAD RAN" not in out
    behind = start_run(
        server.url, lock, ["sh", "-c", "echo BEHIND RAN"], "--ttl", "6s", skewed=-30.0
    )
    out, err = behind.communicate(timeout=30)
    assert behind.returncode == 75, err
    holder.communicate(timeout=30)
    assert holder.returncode == 0


def test_a_paused_store_stops_the_work_before_its_lock_expires(
    store: tuple[str, Server], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """No renewal while the server is stopped: the run stops its work by the renew deadline
    (ttl 4s, renew 1s: 2.7s after the last renewal), before anyone could take the lock."""
    _, server = store
    lock = lock_name(request)
    started, stopped = tmp_path / "started", tmp_path / "stopped"
    work = (
        f'trap "echo stopped > {stopped}; exit 143" TERM; echo up > {started}; '
        "while :; do sleep 0.05; done"
    )
    holder = start_run(
        server.url, lock, ["sh", "-c", work], "--ttl", "4s", "--renew", "1s", "--skew", "1s"
    )
    wait_for_line(started)
    time.sleep(1.2)  # at least one renewal has gone through
    paused = time.monotonic()
    server.pause()
    try:
        wait_for_line(stopped)
        stopped_after = time.monotonic() - paused
        holder.communicate(timeout=20)
    finally:
        server.resume()
    assert holder.returncode == 70
    # The last renewal was at most one renew period (1s) before the pause, so a contender
    # with the same skew (1s) may take the lock ttl + skew - 1s = 4s after the pause at the
    # earliest; the holder gives up 2.7s after its last renewal, and its work stopped.
    assert stopped_after < 4.0, stopped_after
    # Once the lock has expired on the store's clock (ttl + skew), a waiting run takes it.
    after = start_run(
        server.url, lock, ["true"], "--ttl", "4s", "--policy", "wait", "--wait-timeout", "20s"
    )
    _, err = after.communicate(timeout=30)
    assert after.returncode == 0, err
    assert "expired" in err


def test_a_wrong_password_fails_closed_and_is_never_shown(store: tuple[str, Server]) -> None:
    _, server = store
    wrong = "wrong-" + os.urandom(4).hex()
    head, tail = server.url.split("@", 1)  # scheme://[user]:PASSWORD @ host...
    url_text = f"{head.rsplit(':', 1)[0]}:{wrong}@{tail}"
    run = start_run(url_text, "tests/wrong-password", ["sh", "-c", "echo RAN"])
    out, err = run.communicate(timeout=30)
    assert run.returncode == 69, err
    assert "RAN" not in out
    assert "forbidden" in err
    assert wrong not in err


def transport(kind: str, url: str, timeout: float = 5.0) -> RedisLeaseStore | PostgresLeaseStore:
    """The store's client as the sidecar makes it, on this machine's wall clock."""
    parsed = parse_store_url(url, "--store")
    store = RedisLeaseStore if kind == "redis" else PostgresLeaseStore
    return store(parsed, lambda: datetime.now(UTC), timeout)


def delete_by_hand(kind: str, url: str, lease: LeaseRef) -> None:
    if kind == "redis":
        with redis.Redis.from_url(url) as client:
            assert client.delete(keys(lease)[0]) == 1
    else:
        with psycopg.connect(url, autocommit=True) as connection:
            deleted = connection.execute(
                "DELETE FROM cronlock_locks WHERE namespace = %s AND name = %s",
                (lease.namespace, lease.name),
            ).rowcount
            assert deleted == 1


def test_writes_are_compare_and_set_and_tokens_only_grow(
    store: tuple[str, Server], request: pytest.FixtureRequest
) -> None:
    kind, server = store
    lease = LeaseRef(*lock_name(request).split("/"))
    timing = Timing.of(6.0, None, 2.0)
    with transport(kind, server.url) as client:
        with pytest.raises(NotFound):
            client.get(lease)
        body: dict[str, Any] = {
            "metadata": {"name": lease.name, "namespace": lease.namespace},
            "spec": {},
        }
        first = client.create(lease, claimed(body, "a", timing, datetime.now(UTC), ""))
        with pytest.raises(Conflict):
            client.create(lease, claimed(body, "b", timing, datetime.now(UTC), ""))
        read = client.get(lease)
        assert read_lease(read).holder == "a"
        client.replace(lease, renewed(read, timing, datetime.now(UTC)))
        # A second write from the same read is stale: someone (we) wrote since.
        with pytest.raises(Conflict):
            client.replace(lease, claimed(read, "b", timing, datetime.now(UTC), ""))
        taken = client.replace(
            lease, claimed(client.get(lease), "b", timing, datetime.now(UTC), "")
        )
        token_before = read_lease(taken).transitions
        assert token_before > read_lease(first).transitions
        delete_by_hand(kind, server.url, lease)
        with pytest.raises(NotFound):
            client.replace(lease, renewed(taken, timing, datetime.now(UTC)))
        again = client.create(lease, claimed(body, "c", timing, datetime.now(UTC), ""))
        assert read_lease(again).transitions > token_before


def test_a_stopped_store_answers_unavailable_within_the_timeout(
    store: tuple[str, Server], request: pytest.FixtureRequest
) -> None:
    kind, server = store
    lease = LeaseRef(*lock_name(request).split("/"))
    with transport(kind, server.url, timeout=1.0) as client:
        with pytest.raises(NotFound):
            client.get(lease)  # connected
        server.pause()
        try:
            began = time.monotonic()
            with pytest.raises(Unavailable):
                client.get(lease)
            waited = time.monotonic() - began
        finally:
            server.resume()
        assert waited < 2.5, waited
        with pytest.raises(NotFound):
            client.get(lease)  # connects again
