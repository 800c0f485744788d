"""Permits in a store (issue 58, item 1): runs share a lock of N permits in Redis, as on a Lease.

Each test takes the lock through `LeaseKeeper`, the sidecar's own keeper, one client per
run (as each run's sidecar has its own), on a real server (tests/support/stores.py). The
store is a fixture parameter so that each store whose rules keep permits runs the same
tests (docs/DECISIONS.md, "Permits in a store"): Redis' library v4 here; PostgreSQL's rules
join when they keep them too.
"""

from __future__ import annotations

import os
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from cronlock_sidecar.holding.lease import Acquired, Busy, LeaseKeeper, RenewOutcome
from cronlock_sidecar.holding.outcomes import SystemClock
from cronlock_sidecar.lock.model import Timing
from cronlock_sidecar.lock.permits import read_permits
from cronlock_sidecar.stores.redisstore import RedisLeaseStore, keys
from cronlock_sidecar.stores.url import parse_store_url
from cronlock_sidecar.transport.seam import LeaseRef
from tests.support.kube import wait_for
from tests.support.paths import SIDECAR
from tests.support.stores import RedisServer
from tests.support.timing import SLACK

STORES = ("redis",)
TTL_30S = Timing.of(30.0, None, 1.0)


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> tuple[str, str]:
    """The store's kind and its URL."""
    server: RedisServer = request.getfixturevalue(f"{request.param}_store")
    return request.param, server.url


def client(kind: str, url: str) -> RedisLeaseStore:
    """One run's client, as its sidecar makes it."""
    assert kind == "redis"
    return RedisLeaseStore(parse_store_url(url, "--store"), lambda: datetime.now(UTC), 5.0)


def fresh(request: pytest.FixtureRequest) -> LeaseRef:
    name = request.node.name.replace("[", "-").replace("]", "").replace("_", "-").lower()
    return LeaseRef("permits", f"{name[-40:]}-{os.getpid()}")


def keeper(
    transport: RedisLeaseStore,
    lease: LeaseRef,
    identity: str,
    timing: Timing = TTL_30S,
    permits: int = 2,
) -> LeaseKeeper:
    """A run's keeper as `cronlock-sidecar run --store … --permits N` makes it."""
    return LeaseKeeper(
        transport, lease, identity, timing, SystemClock(), caps_holds=True, permits=permits
    )


def delete_by_hand(kind: str, url: str, lease: LeaseRef) -> None:
    """The lock itself deleted, as an admin (or a failover) might: its counters stay."""
    assert kind == "redis"
    with redis.Redis.from_url(url) as admin:
        assert admin.delete(keys(lease)[0]) == 1


def test_two_runs_hold_a_lock_of_two_permits_and_a_third_is_busy(
    store: tuple[str, str], request: pytest.FixtureRequest
) -> None:
    """a and b hold at once, c finds both permits held; once a gives its permit back, c
    takes it, with the next token of that permit."""
    kind, url = store
    lease = fresh(request)
    with client(kind, url) as ta, client(kind, url) as tb, client(kind, url) as tc:
        a, b, c = keeper(ta, lease, "a"), keeper(tb, lease, "b"), keeper(tc, lease, "c")
        first, second = a.try_acquire(), b.try_acquire()
        assert isinstance(first, Acquired)
        assert isinstance(second, Acquired)
        assert (first.permit, second.permit) == (0, 1)
        busy = c.try_acquire()
        assert isinstance(busy, Busy)
        assert busy.permits == ("a", "b")
        assert busy.message().startswith(f"all 2 permits of lock {lease} are held")
        assert a.release()
        third = c.try_acquire()
        assert isinstance(third, Acquired)
        assert (third.permit, third.transitions) == (0, first.transitions + 1)
        assert b.renew().outcome is RenewOutcome.RENEWED
        holders = [permit.holder for permit in read_permits(tc.get(lease))]
    assert holders == ["c", "b"]


def test_each_permits_token_grows_by_one_per_holder_and_never_goes_back(
    store: tuple[str, str], request: pytest.FixtureRequest
) -> None:
    """Permit 1 handed to b, d and (after the lock was deleted by hand) f: tokens 1, 2, 3;
    a renewal and a release keep a token; permit 0's token is the spec's own."""
    kind, url = store
    lease = fresh(request)
    tokens: list[int] = []
    with client(kind, url) as ta:
        a = keeper(ta, lease, "a")
        assert isinstance(a.try_acquire(), Acquired)
        for name in ("b", "d"):
            with client(kind, url) as transport:
                run = keeper(transport, lease, name)
                taken = run.try_acquire()
                assert isinstance(taken, Acquired)
                assert taken.permit == 1
                tokens.append(taken.transitions)
                assert run.renew().outcome is RenewOutcome.RENEWED
                assert read_permits(transport.get(lease))[1].transitions == taken.transitions
                assert run.release()
                assert read_permits(transport.get(lease))[1].transitions == taken.transitions
        spec_token = read_permits(ta.get(lease))[0].transitions
        assert a.release()
    delete_by_hand(kind, url, lease)
    with client(kind, url) as te, client(kind, url) as tf:
        e, f = keeper(te, lease, "e"), keeper(tf, lease, "f")
        again, last = e.try_acquire(), f.try_acquire()
        assert isinstance(again, Acquired)
        assert isinstance(last, Acquired)
        assert (again.permit, last.permit) == (0, 1)
        tokens.append(last.transitions)
        assert again.transitions > spec_token
    assert tokens == [1, 2, 3]


def test_an_expired_permit_is_taken_over_and_a_renewed_one_kept(
    store: tuple[str, str], request: pytest.FixtureRequest
) -> None:
    """ttl 2 s, no skew: a renews permit 0 every 0.3 s, b never renews permit 1. c, trying
    meanwhile, takes permit 1 once b's 2 s have passed on the store's clock, never a's."""
    kind, url = store
    lease = fresh(request)
    timing = Timing.of(2.0, None, 0.0)
    with client(kind, url) as ta, client(kind, url) as tb, client(kind, url) as tc:
        a, b = keeper(ta, lease, "a", timing), keeper(tb, lease, "b", timing)
        c = keeper(tc, lease, "c", timing)
        assert isinstance(a.try_acquire(), Acquired)
        taken_by_b = b.try_acquire()
        assert isinstance(taken_by_b, Acquired)
        b_claimed = time.monotonic()
        outcomes: list[Acquired | Busy] = []

        def taken() -> bool:
            assert a.renew().outcome is RenewOutcome.RENEWED
            outcomes.append(c.try_acquire())
            return isinstance(outcomes[-1], Acquired)

        wait_for(taken, 10, "b's permit to expire on the store's clock", every=0.3)
        took = time.monotonic() - b_claimed
        result = outcomes[-1]
        assert isinstance(result, Acquired)
        assert (result.permit, result.reason) == (1, "expired")
        assert result.transitions == taken_by_b.transitions + 1
        # From just after b's claim was answered: its store time is a little earlier.
        assert timing.ttl - 0.1 <= took < timing.ttl + SLACK, took
        assert all(isinstance(outcome, Busy) for outcome in outcomes[:-1])
        assert a.renew().outcome is RenewOutcome.RENEWED
        assert b.renew().outcome is RenewOutcome.LOST
        holders = [permit.holder for permit in read_permits(ta.get(lease))]
    assert holders == ["a", "c"]


def test_run_permits_with_the_store_lets_two_commands_work_at_once(
    store: tuple[str, str], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """`cronlock-sidecar run --permits 2 --store URL`: two commands work at once, each told
    its own permit, and a third run skips with the line naming both holders."""
    _, url = store
    lease = fresh(request)
    release = tmp_path / "release"
    env = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
    env["CRONLOCK_STORE"] = url

    def run(name: str) -> subprocess.Popen[str]:
        work = (
            f'echo "$CRONLOCK_PERMIT" > {tmp_path / name}; '
            f"until [ -e {release} ]; do sleep 0.05; done"
        )
        return subprocess.Popen(
            [str(SIDECAR), "run", "--lease", str(lease), "--permits", "2", "--ttl", "10s",
             "--", "sh", "-c", work],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    first = run("first")
    try:
        wait_for(lambda: (tmp_path / "first").exists(), 30, "the first run's work")
        second = run("second")
        try:
            wait_for(lambda: (tmp_path / "second").exists(), 30, "the second run's work")
            third = subprocess.run(
                [str(SIDECAR), "run", "--lease", str(lease), "--permits", "2", "--", "true"],
                env=env, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
        finally:
            release.touch()
            second.communicate(timeout=30)
    finally:
        release.touch()
        first.communicate(timeout=30)
    assert (first.returncode, second.returncode) == (0, 0)
    permits = {(tmp_path / name).read_text().strip() for name in ("first", "second")}
    assert permits == {"0", "1"}
    assert third.returncode == 75, third.stderr
    assert f"all 2 permits of lock {lease} are held" in third.stderr
