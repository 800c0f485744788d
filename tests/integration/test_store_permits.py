"""Permits in a store (issue 58 item 1): N runs hold one lock at once through the keeper.

Each store is set up exactly as docs/STORES.md says and written with one namespace's
credential, as its sidecars write it: `LeaseKeeper` (the sidecar's own) claims, renews and
releases permits of a lock of `cronlock.io/permits: 2`, and the store's rules
(docs/DECISIONS.md, "Permits in a store") decide. The fencing token of each permit is the
store's, one more per new holder, and never goes back, also after the lock's row or key
is deleted. The attacks from a tenant's side are in test_postgres_tenants.py (PostgreSQL).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

from cronlock_sidecar.holding.lease import LeaseKeeper
from cronlock_sidecar.holding.outcomes import (
    Acquired,
    Busy,
    PermitsDisagree,
    RenewOutcome,
    SystemClock,
)
from cronlock_sidecar.lock import permits
from cronlock_sidecar.lock.model import Timing, claimed, read_lease, released, renewed
from cronlock_sidecar.stores.pgstore import PostgresLeaseStore
from cronlock_sidecar.stores.url import parse_store_url
from cronlock_sidecar.transport.seam import Forbidden, LeaseRef, LeaseTransport
from tests.integration.test_postgres_tenants import statements, tenant_store
from tests.support.kube import wait_for
from tests.support.paths import SIDECAR
from tests.support.stores import PostgresServer, documented

HERE = Path(__file__).parent
NAMESPACE = "permit-a"
TTL_30S = Timing.of(30.0, None, 1.0)
TTL_1S = Timing.of(1.0, None, 0.0)
# The release before (PostgreSQL rules 3): its schema text, and the check its sidecars
# make before they run it (pgstore's _SCHEMA_PRESENT of that release).
RULES_3 = (HERE / "pg_schema_3_rules_3.sql").read_text()
RULES_3_PRESENT = """
SELECT coalesce(pg_catalog.obj_description(pg_catalog.to_regclass('cronlock.locks'), 'pg_class'),
                '') LIKE 'cronlock locks, schema 3 %'
   AND coalesce(pg_catalog.obj_description(
           pg_catalog.to_regprocedure('cronlock.keep_rules()'), 'pg_proc'), '')
       LIKE 'cronlock rules 3: %'
"""


@dataclass
class Store:
    """A store set up as documented: the namespace's credential and the admin's."""

    kind: str
    url: str
    admin_url: str
    connect: Callable[[], LeaseTransport]

    def delete(self, lock: LeaseRef) -> None:
        """The lock removed by hand, as an admin may (the tokens' counters stay)."""
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(
                "DELETE FROM cronlock.locks WHERE namespace = %s AND name = %s",
                (lock.namespace, lock.name),
            )


@pytest.fixture(scope="module")
def postgres_permits(postgres_store: PostgresServer) -> Store:
    made = tenant_store(postgres_store, "keepers", (NAMESPACE,), revoke_public=True)
    url = made.urls[NAMESPACE]

    def connect() -> LeaseTransport:
        return PostgresLeaseStore(parse_store_url(url, "--store"), lambda: datetime.now(UTC), 5.0)

    return Store("postgres", url, made.admin_url, connect)


@pytest.fixture(params=["postgres"])
def store(request: pytest.FixtureRequest) -> Store:
    found = request.getfixturevalue(f"{request.param}_permits")
    assert isinstance(found, Store)
    return found


@pytest.fixture
def transports(store: Store) -> Iterator[Callable[[], LeaseTransport]]:
    """A client per keeper, as each run has its own; all closed at the end."""
    made: list[LeaseTransport] = []

    def one() -> LeaseTransport:
        made.append(store.connect())
        return made[-1]

    yield one
    for transport in made:
        close = getattr(transport, "close", None)
        if close is not None:
            close()


def fresh(name: str) -> LeaseRef:
    return LeaseRef(NAMESPACE, f"{name}-{os.urandom(3).hex()}")


def keeper(
    transport: LeaseTransport, lock: LeaseRef, identity: str, timing: Timing = TTL_30S
) -> LeaseKeeper:
    """A run of `run --permits 2 --store ...` as the sidecar makes it (caps_holds)."""
    return LeaseKeeper(transport, lock, identity, timing, SystemClock(), caps_holds=True, permits=2)


def acquired(result: Acquired | Busy) -> Acquired:
    assert isinstance(result, Acquired), result
    return result


def taken_by(run: LeaseKeeper) -> Acquired | None:
    """`run`'s claim, or None while the lock is busy."""
    result = run.try_acquire()
    return result if isinstance(result, Acquired) else None


def holders(transport: LeaseTransport, lock: LeaseRef) -> list[tuple[str, int]]:
    """Each permit's holder and the store's token for it, as a reader gets them."""
    return [(p.holder, p.transitions) for p in permits.read_permits(transport.get(lock))]


def test_two_runs_hold_a_lock_of_two_permits_and_a_third_is_busy(
    store: Store, transports: Callable[[], LeaseTransport]
) -> None:
    lock = fresh("two")
    first = keeper(transports(), lock, "run-1")
    second = keeper(transports(), lock, "run-2")
    third = keeper(transports(), lock, "run-3")
    one = acquired(first.try_acquire())
    two = acquired(second.try_acquire())
    assert (one.permit, one.transitions, two.permit, two.transitions) == (0, 1, 1, 1)
    busy = third.try_acquire()
    assert isinstance(busy, Busy)
    assert busy.permits == ("run-1", "run-2")
    # Both renew beside each other (each write carries the other's permit as read).
    for _ in range(2):
        assert first.renew().outcome is RenewOutcome.RENEWED
        assert second.renew().outcome is RenewOutcome.RENEWED
    assert isinstance(third.try_acquire(), Busy)
    # A release frees one permit: the third run takes it, with the next token of permit 1.
    assert second.release()
    three = acquired(third.try_acquire())
    assert (three.permit, three.transitions) == (1, 2)
    assert holders(transports(), lock) == [("run-1", 1), ("run-3", 2)]
    assert first.renew().outcome is RenewOutcome.RENEWED


def test_tokens_per_permit_grow_by_one_per_holder_and_survive_the_row(
    store: Store, transports: Callable[[], LeaseTransport]
) -> None:
    lock = fresh("tokens")
    base = keeper(transports(), lock, "base")
    acquired(base.try_acquire())
    tokens = []
    for number in range(3):
        run = keeper(transports(), lock, f"run-{number}")
        taken = acquired(run.try_acquire())
        assert taken.permit == 1
        tokens.append(taken.transitions)
        assert run.release()
    assert tokens == [1, 2, 3]
    # A released permit keeps its token; the spec's own token did not move.
    assert holders(transports(), lock) == [("base", 1), ("", 3)]
    assert base.release()
    store.delete(lock)
    again = keeper(transports(), lock, "again")
    later = keeper(transports(), lock, "later")
    assert acquired(again.try_acquire()).transitions == 2  # the spec's counter went on
    assert acquired(later.try_acquire()).transitions == 4  # and permit 1's
    assert holders(transports(), lock) == [("again", 2), ("later", 4)]


def test_an_expired_permit_is_taken_over_and_a_renewal_keeps_it(
    store: Store, transports: Callable[[], LeaseTransport]
) -> None:
    lock = fresh("expiry")
    base = keeper(transports(), lock, "base")
    acquired(base.try_acquire())
    short = keeper(transports(), lock, "short", TTL_1S)
    assert acquired(short.try_acquire()).permit == 1
    # (A ttl of 30 s: a run believes a stored hold at most for its own ttl, so with 1 s it
    # would take the base's permit 0 as well.)
    contender = keeper(transports(), lock, "contender")
    renewals = 0
    until = time.monotonic() + 2.5  # past the 1 s hold more than twice over
    while time.monotonic() < until:
        assert short.renew().outcome is RenewOutcome.RENEWED
        renewals += 1
        assert isinstance(contender.try_acquire(), Busy)
        time.sleep(0.3)
    assert renewals >= 5
    # Not renewed any more: after its 1 s on the store's clock the permit is taken over.
    taken = wait_for(lambda: taken_by(contender), 10, "the short hold to expire")
    assert (taken.permit, taken.transitions, taken.reason) == (1, 2, "expired")
    assert short.renew().outcome is RenewOutcome.LOST
    assert holders(transports(), lock) == [("base", 1), ("contender", 2)]


def run_command(url: str, lock: LeaseRef, script: str) -> subprocess.Popen[str]:
    """`cronlock-sidecar run --permits 2 --store URL` as a user runs it outside Kubernetes."""
    env = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
    argv = [str(SIDECAR), "run", "--lease", f"{lock.namespace}/{lock.name}", "--permits", "2"]
    return subprocess.Popen(
        [*argv, "--ttl", "6s", "--", "sh", "-c", script],
        env={**env, "CRONLOCK_STORE": url},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def ended(process: subprocess.Popen[str]) -> tuple[int, str]:
    """The process' exit code and stderr, once it ended (killed after 60 s)."""
    try:
        _, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
    return process.returncode, err


def test_two_sidecar_runs_work_at_once_and_a_third_skips(store: Store, tmp_path: Path) -> None:
    """The command itself: two runs work at once, each told its permit and that permit's
    token; a third skips (exit 75) with one line naming both holders."""
    lock = fresh("cli")
    release = tmp_path / "release"
    told = [tmp_path / "first", tmp_path / "second"]
    running: list[subprocess.Popen[str]] = []
    try:
        for path in told:
            script = (
                f'echo "$CRONLOCK_PERMIT $CRONLOCK_FENCING_TOKEN" > {path}.tmp; '
                f"mv {path}.tmp {path}; until [ -e {release} ]; do sleep 0.05; done"
            )
            running.append(run_command(store.url, lock, script))
            started = time.monotonic()
            while not path.exists() and running[-1].poll() is None:
                assert time.monotonic() - started < 30, f"{path.name} run did not start work"
                time.sleep(0.05)
            assert path.exists(), ended(running[-1])
        code, err = ended(run_command(store.url, lock, "echo THIRD RAN >&2"))
    finally:
        release.touch()
        results = [ended(process) for process in running]
    assert code == 75, err
    assert "THIRD RAN" not in err
    skips = [line for line in err.splitlines() if "all 2 permits of lock" in line]
    assert len(skips) == 1, err
    assert sorted(path.read_text().split() for path in told) == [["0", "1"], ["1", "1"]]
    assert [result[0] for result in results] == [0, 0], results


def test_a_schema_3_database_with_a_held_lock_gets_the_permit_rules_in_place(
    postgres_store: PostgresServer,
) -> None:
    """A database the release before set up (rules 3) with a lock held by its sidecar:
    this release's namespace sidecar is refused (exit 69, the pointer to the schema) until
    the admin runs the schema again; then the held lock is still held, with its token,
    the release before still finds its rules (it never runs its own text over the new
    trigger), and once its hold is given back two runs hold the lock's two permits."""
    admin, database, password = "cronlock_admin_r3", "permits_r3", os.urandom(8).hex()
    namespace = "permit-r3"  # a role of its own: roles are the server's, not a database's
    owner = (
        documented("postgres-owner")
        .replace("cronlock_admin", admin)
        .replace("DATABASE cronlock ", f"DATABASE {database} ")
        .replace("'PASSWORD'", f"'{password}'")
    )
    with postgres_store.superuser() as superuser:
        for statement in statements(owner):
            superuser.execute(statement)
    admin_url = postgres_store.url_of(admin, password, database)
    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute(RULES_3)
        connection.execute(documented("postgres-rls-once"))
    secret = os.urandom(8).hex()
    with postgres_store.superuser(database) as superuser:
        role = documented("postgres-rls-role").replace("team-a", namespace)
        superuser.execute(role.replace("'PASSWORD'", f"'{secret}'"))
    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute(documented("postgres-rls-namespace").replace("team-a", namespace))
    url = postgres_store.url_of(namespace, secret, database)
    lock = LeaseRef(namespace, "upgraded")
    # The release before's sidecar holds the lock (its statements: document and clock).
    held = claimed({"metadata": {}}, "old-run", TTL_30S, datetime.now(UTC), "")
    with psycopg.connect(url, autocommit=True) as before:
        before.execute(
            "INSERT INTO cronlock.locks (namespace, name, holder, transitions,"
            " resource_version, document, writer_time, written_at)"
            " VALUES (%s, %s, '', 0, 0, %s::jsonb, %s, pg_catalog.now())",
            (lock.namespace, lock.name, json.dumps(held), datetime.now(UTC)),
        )
        assert before.execute(RULES_3_PRESENT).fetchone() == (True,)
    tenant = PostgresLeaseStore(parse_store_url(url, "--store"), lambda: datetime.now(UTC))
    with tenant, pytest.raises(Forbidden, match="the admin role runs the schema") as refusal:
        tenant.get(lock)
    assert "permission denied for schema cronlock" in str(refusal.value)
    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute(documented("postgres-schema"))
    with psycopg.connect(url, autocommit=True) as before:
        assert before.execute(RULES_3_PRESENT).fetchone() == (True,)
        # Its renewal passes through the new trigger, as before.
        document = before.execute(
            "SELECT document FROM cronlock.locks WHERE name = 'upgraded'"
        ).fetchone()
        assert document is not None
        before.execute(
            "UPDATE cronlock.locks SET document = %s::jsonb, writer_time = %s"
            " WHERE name = 'upgraded'",
            (json.dumps(renewed(document[0], TTL_30S, datetime.now(UTC))), datetime.now(UTC)),
        )
    with PostgresLeaseStore(parse_store_url(url, "--store"), lambda: datetime.now(UTC)) as after:
        current = after.get(lock)
        assert (read_lease(current).holder, read_lease(current).transitions) == ("old-run", 1)
        with pytest.raises(Forbidden, match="the lock is held by old-run"):
            after.replace(lock, claimed(current, "intruder", TTL_30S, datetime.now(UTC), ""))
        run = keeper(after, lock, "new-run")
        # N = 2 is not written under the old run's live hold (the keeper refuses before the
        # trigger would: rule 1, test_postgres_tenants.py).
        with pytest.raises(PermitsDisagree, match="says '1' permits"):
            run.try_acquire()
        after.replace(lock, released(after.get(lock), "old-run", datetime.now(UTC)))
        with PostgresLeaseStore(
            parse_store_url(url, "--store"), lambda: datetime.now(UTC)
        ) as other:
            one = acquired(keeper(after, lock, "new-run").try_acquire())
            two = acquired(keeper(other, lock, "second-run").try_acquire())
        assert (one.permit, one.transitions, two.permit, two.transitions) == (0, 2, 1, 1)
