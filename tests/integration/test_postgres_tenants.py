"""PostgreSQL with a role per namespace, set up exactly as docs/STORES.md says, on a real server.

Each test gets a database of its own, owned by an admin role as the docs make it; the
namespaces' roles get the documented grants. The attacks are written from a tenant's
side: it may create in `public` (PostgreSQL 14's default, granted here), plants
overloads, operators and `pg_temp` tables, locks the tables and holds sessions open; what
it must not reach is another namespace's locks, the trigger, or the fencing token.
"""

from __future__ import annotations

import copy
import json
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from cronlock_sidecar.contract import ANNOTATION_FROZEN_UNTIL, ANNOTATION_PERMITS
from cronlock_sidecar.lock import permits
from cronlock_sidecar.lock.model import Timing, claimed, read_lease, released, renewed
from cronlock_sidecar.lock.ticks import TickRecord
from cronlock_sidecar.stores.documents import unversioned
from cronlock_sidecar.stores.pgstore import PostgresLeaseStore
from cronlock_sidecar.stores.url import parse_store_url
from cronlock_sidecar.transport.seam import Forbidden, LeaseRef, NotFound, Unavailable
from tests.support.kube import wait_for
from tests.support.stores import PostgresServer, documented

TTL_30S = Timing.of(30.0, None, 1.0)
TTL_1S = Timing.of(1.0, None, 0.0)
# Every lock mode that conflicts with ROW EXCLUSIVE (what an INSERT or UPDATE takes), and
# SHARE UPDATE EXCLUSIVE (which stops autovacuum).
MODES_THAT_STOP_WRITERS = (
    "ACCESS EXCLUSIVE",
    "EXCLUSIVE",
    "SHARE ROW EXCLUSIVE",
    "SHARE",
    "SHARE UPDATE EXCLUSIVE",
)


@dataclass
class TenantStore:
    """A database set up by the docs' blocks: its admin's URL and each namespace's."""

    database: str
    admin: str
    admin_url: str
    urls: dict[str, str]


def statements(block: str) -> list[str]:
    """A documented block's statements, one by one (CREATE DATABASE runs alone)."""
    return [part.strip() for part in block.split(";\n") if part.strip()]


def tenant_store(
    server: PostgresServer, tag: str, namespaces: tuple[str, ...], *, revoke_public: bool
) -> TenantStore:
    """docs/STORES.md's PostgreSQL set-up, block by block, with generated passwords;
    `revoke_public`: whether the PostgreSQL 14 advice is followed."""
    admin, database = f"cronlock_admin_{tag}", f"tenants_{tag}"
    password = os.urandom(8).hex()
    owner = (
        documented("postgres-owner")
        .replace("cronlock_admin", admin)
        .replace("DATABASE cronlock ", f"DATABASE {database} ")
        .replace("'PASSWORD'", f"'{password}'")
    )
    with server.superuser() as superuser:
        for statement in statements(owner):
            superuser.execute(statement)
    admin_url = server.url_of(admin, password, database)
    urls = {}
    with psycopg.connect(admin_url, autocommit=True) as connection:
        if revoke_public:
            connection.execute(documented("postgres-public"))
        connection.execute(documented("postgres-schema"))
        connection.execute(documented("postgres-rls-once"))
    for namespace in namespaces:
        secret = os.urandom(8).hex()
        role = documented("postgres-rls-role").replace("team-a", namespace)
        with server.superuser(database) as superuser:
            superuser.execute(role.replace("'PASSWORD'", f"'{secret}'"))
        with psycopg.connect(admin_url, autocommit=True) as connection:
            connection.execute(documented("postgres-rls-namespace").replace("team-a", namespace))
        urls[namespace] = server.url_of(namespace, secret, database)
    return TenantStore(database, admin, admin_url, urls)


def transport(url: str) -> PostgresLeaseStore:
    """The store's client as the sidecar makes it (it never creates the schema here:
    the admin did, and a namespace's role may not)."""
    return PostgresLeaseStore(parse_store_url(url, "--store"), lambda: datetime.now(UTC), 5.0)


def take_over(client: PostgresLeaseStore, lease: LeaseRef, who: str, timing: Timing) -> Any:
    """`who` claims the lock as it reads now; None while the store refuses (held)."""
    try:
        return client.replace(lease, claimed(client.get(lease), who, timing, datetime.now(UTC), ""))
    except Forbidden:
        return None


def frozen(current: dict[str, Any]) -> dict[str, Any]:
    """`current` with a freeze written on it, as `cronlock freeze --store-secret` does."""
    body = copy.deepcopy(current)
    notes = body.setdefault("metadata", {}).setdefault("annotations", {})
    notes[ANNOTATION_FROZEN_UNTIL] = "2099-01-01T00:00:00.000000Z"
    return body


def test_each_namespace_holds_its_own_locks_with_the_documented_grants_only(
    postgres_store: PostgresServer,
) -> None:
    """Every write a sidecar and `cronlock freeze` make passes with the documented grants
    (create, renew, takeover after expiry, release, freeze, a freeze on a lock never
    taken); another namespace's lock reads as absent and is not the tenant's to take."""
    store = tenant_store(postgres_store, "rls", ("team-a", "team-b"), revoke_public=True)
    body: dict[str, Any] = {"metadata": {}}
    own, other = LeaseRef("team-a", "rls-report"), LeaseRef("team-b", "rls-report")
    never = LeaseRef("team-a", "rls-never-taken")
    with transport(store.urls["team-b"]) as team_b:
        team_b.create(other, claimed(body, "b", TTL_30S, datetime.now(UTC), ""))
    with transport(store.urls["team-a"]) as team_a:
        first = team_a.create(own, claimed(body, "a", TTL_1S, datetime.now(UTC), ""))
        team_a.replace(own, renewed(team_a.get(own), TTL_1S, datetime.now(UTC)))
        taken = wait_for(lambda: take_over(team_a, own, "a2", TTL_30S), 10, "a's 1 s to pass")
        assert read_lease(taken).transitions == read_lease(first).transitions + 1
        team_a.replace(own, released(team_a.get(own), "a2", datetime.now(UTC)))
        team_a.replace(own, frozen(team_a.get(own)))
        after = read_lease(team_a.get(own))
        assert (after.holder, after.frozen_until is not None) == ("", True)
        team_a.create(never, frozen({"metadata": {}, "spec": {}}))
        assert read_lease(team_a.get(never)).frozen_until is not None
        with pytest.raises(NotFound):
            team_a.get(other)
        with pytest.raises(Forbidden, match="row-level security"):
            team_a.create(other, claimed(body, "a", TTL_30S, datetime.now(UTC), ""))
    with psycopg.connect(store.urls["team-a"], autocommit=True) as raw:
        assert (
            raw.execute(
                "UPDATE cronlock.locks SET document = document WHERE namespace = 'team-b'"
            ).rowcount
            == 0
        )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            raw.execute("DELETE FROM cronlock.locks WHERE namespace = 'team-a'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="schema public"):
            raw.execute("CREATE FUNCTION public.f() RETURNS int LANGUAGE sql AS 'SELECT 1'")
    with transport(store.urls["team-b"]) as team_b:
        assert read_lease(team_b.get(other)).holder == "b"
    with psycopg.connect(store.admin_url, autocommit=True) as admin:
        holds = admin.execute(documented("postgres-who-holds")).fetchall()
    assert [(row[0], row[1], row[2]) for row in holds] == [
        ("team-a", "rls-never-taken", ""),
        ("team-a", "rls-report", ""),
        ("team-b", "rls-report", "b"),
    ]


def test_a_namespaces_sidecar_never_makes_the_schema_and_says_who_does(
    postgres_store: PostgresServer,
) -> None:
    """Before the admin ran the schema, a namespace's sidecar is refused (exit 69) with a
    pointer to the block, and nothing is created; a reader (`cronlock status`) finds no
    lock rather than an error."""
    admin, database = "cronlock_admin_early", "tenants_early"
    owner = (
        documented("postgres-owner")
        .replace("cronlock_admin", admin)
        .replace("DATABASE cronlock ", f"DATABASE {database} ")
    )
    secret = os.urandom(8).hex()
    with postgres_store.superuser() as superuser:
        for statement in statements(owner):
            superuser.execute(statement)
        role = documented("postgres-rls-role").replace("team-a", "team-early")
        superuser.execute(role.replace("'PASSWORD'", f"'{secret}'"))
    url = postgres_store.url_of("team-early", secret, database)
    lease = LeaseRef("team-early", "report")
    with (
        transport(url) as sidecar,
        pytest.raises(Forbidden, match="permission denied for database") as refused,
    ):
        sidecar.create(lease, claimed({"metadata": {}}, "e", TTL_30S, datetime.now(UTC), ""))
    assert 'the admin role runs the schema in docs/STORES.md, "PostgreSQL: tables"' in str(
        refused.value
    )
    reader = PostgresLeaseStore(
        parse_store_url(url, "--store"), lambda: datetime.now(UTC), create_tables=False
    )
    with reader, pytest.raises(NotFound, match=r'relation "cronlock\.locks" does not exist'):
        reader.get(lease)
    with postgres_store.superuser(database) as superuser:
        assert superuser.execute("SELECT to_regnamespace('cronlock')").fetchone() == (None,)


# A tenant with CREATE on public plants what the trigger (or the sidecar's own statements)
# could resolve on a search path that has public, before or after pg_catalog: better-typed
# overloads (make_interval(secs integer), nextval(text)), same-signature functions and
# operators (which win where a path puts public first), and each records who ran it.
PLANT = """
CREATE TABLE public.loot (who text, what text);
GRANT INSERT ON public.loot TO PUBLIC;
CREATE FUNCTION public.looted(what text) RETURNS boolean LANGUAGE sql
    AS $$ INSERT INTO public.loot VALUES (current_user, what) RETURNING true $$;
CREATE FUNCTION public.make_interval(secs integer) RETURNS interval LANGUAGE sql
    AS $$ SELECT CASE WHEN public.looted('make_interval') THEN interval '-1 second' END $$;
CREATE FUNCTION public.nextval(text) RETURNS bigint LANGUAGE sql
    AS $$ SELECT CASE WHEN public.looted('nextval(text)') THEN -1000::bigint END $$;
CREATE FUNCTION public.nextval(regclass) RETURNS bigint LANGUAGE sql
    AS $$ SELECT CASE WHEN public.looted('nextval(regclass)') THEN -1000::bigint END $$;
CREATE FUNCTION public.clock_timestamp() RETURNS timestamptz LANGUAGE sql
    AS $$ SELECT CASE WHEN public.looted('clock_timestamp') THEN '2999-01-01'::timestamptz END $$;
CREATE FUNCTION public.jsonb_typeof(jsonb) RETURNS text LANGUAGE sql
    AS $$ SELECT CASE WHEN public.looted('jsonb_typeof') THEN 'number' END $$;
CREATE FUNCTION public.starts_with(text, text) RETURNS boolean LANGUAGE sql
    AS $$ SELECT public.looted('starts_with') $$;
CREATE FUNCTION public."left"(text, integer) RETURNS text LANGUAGE sql
    AS $$ SELECT CASE WHEN public.looted('left') THEN '' END $$;
CREATE FUNCTION public.format(text, VARIADIC text[]) RETURNS text LANGUAGE sql
    AS $$ SELECT CASE WHEN public.looted('format') THEN 'planted' END $$;
CREATE FUNCTION public.planted_gt(interval, interval) RETURNS boolean LANGUAGE sql
    AS $$ SELECT public.looted('>(interval, interval)') $$;
CREATE OPERATOR public.> (LEFTARG = interval, RIGHTARG = interval, FUNCTION = public.planted_gt);
CREATE FUNCTION public.planted_minus(timestamptz, timestamptz) RETURNS interval LANGUAGE sql
    AS $$ SELECT CASE WHEN public.looted('-(timestamptz, timestamptz)')
               THEN interval '1 day' END $$;
CREATE OPERATOR public.- (LEFTARG = timestamptz, RIGHTARG = timestamptz,
                          FUNCTION = public.planted_minus);
CREATE FUNCTION public.planted_cat(text, text) RETURNS text LANGUAGE sql
    AS $$ SELECT CASE WHEN public.looted('||(text, text)') THEN '' END $$;
CREATE OPERATOR public.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = public.planted_cat);
"""
# The same tenant's own session: temporary tables and a sequence with the new names (and
# the old ones), a fence of -1000 for its own lock, for an unqualified name to find first.
SHADOW = """
CREATE TEMP TABLE fences (namespace text, name text, value bigint, PRIMARY KEY (namespace, name));
CREATE TEMP TABLE cronlock_fences (LIKE pg_temp.fences INCLUDING ALL);
CREATE TEMP TABLE locks (LIKE cronlock.locks);
CREATE TEMP SEQUENCE versions START -1000 MINVALUE -1000;
INSERT INTO pg_temp.fences VALUES ('team-c', 'shadowed', -1000);
INSERT INTO pg_temp.cronlock_fences VALUES ('team-c', 'shadowed', -1000);
"""
RAW_CREATE = """
INSERT INTO cronlock.locks
    (namespace, name, holder, transitions, resource_version, document, writer_time, written_at)
VALUES ('team-c', %s, '', -1000, -1000, %s::jsonb, pg_catalog.now(), pg_catalog.now())
"""


def test_a_tenant_that_may_create_in_public_runs_nothing_in_anyone_elses_write(
    postgres_store: PostgresServer,
) -> None:
    """N1 and L-N11: team-c (the attacker) may create in public and plants there and in
    its session's pg_temp; team-d's sessions and the admin's put public before pg_catalog.
    team-d's intruder is still refused team-d's live hold, the admin's write and every
    sidecar write run none of the planted code (the loot stays empty), and the tokens
    come from the real fences: 1, 2, ... whatever pg_temp holds."""
    store = tenant_store(postgres_store, "plant", ("team-c", "team-d"), revoke_public=False)
    with postgres_store.superuser(store.database) as superuser:
        superuser.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")  # PostgreSQL 14's default
        for role in ("team-d", store.admin):
            superuser.execute(f'ALTER ROLE "{role}" SET search_path = public, pg_catalog')
    victim = LeaseRef("team-d", "ledger")
    with transport(store.urls["team-d"]) as team_d:
        held = team_d.create(
            victim, claimed({"metadata": {}}, "d-run-1", TTL_30S, datetime.now(UTC), "")
        )
    with psycopg.connect(store.urls["team-c"], autocommit=True) as attacker:
        attacker.execute(PLANT)
        attacker.execute(SHADOW)
        # In the shadowed session, team-c's own lock: created, then taken after its 1 s.
        attacker.execute(RAW_CREATE, ("shadowed", _document("c-run-1", 1)))
        time.sleep(1.2)
        attacker.execute(
            "UPDATE cronlock.locks SET document = %s::jsonb, writer_time = pg_catalog.now()"
            " WHERE namespace = 'team-c' AND name = 'shadowed'",
            (_document("c-run-2", 30),),
        )
        own = attacker.execute(
            "SELECT holder, transitions, resource_version > 0 FROM cronlock.locks"
            " WHERE name = 'shadowed'"
        ).fetchone()
        fence = attacker.execute(
            "SELECT value FROM cronlock.fences WHERE name = 'shadowed'"
        ).fetchone()
        shadow = attacker.execute("SELECT value FROM pg_temp.fences").fetchone()
    assert own == ("c-run-2", 2, True)
    assert fence == (2,)
    assert shadow == (-1000,)
    with transport(store.urls["team-d"]) as team_d:
        assert take_over(team_d, victim, "intruder", TTL_30S) is None
        with psycopg.connect(store.urls["team-d"], autocommit=True) as raw:
            assert raw.execute("SHOW search_path").fetchone() == ("public, pg_catalog",)
            with pytest.raises(psycopg.DatabaseError, match="held by d-run-1") as refused:
                raw.execute(
                    "UPDATE cronlock.locks SET document = %s::jsonb, writer_time = %s"
                    " WHERE namespace = 'team-d' AND name = 'ledger'",
                    (_document("intruder", 30), datetime.now(UTC)),
                )
            assert refused.value.sqlstate == "CLK01"
        # The admin clears team-d's hold by hand, through the trigger, as the tables' owner.
        with psycopg.connect(store.admin_url, autocommit=True) as admin:
            admin.execute(
                "UPDATE cronlock.locks SET document = %s::jsonb, writer_time = %s"
                " WHERE namespace = 'team-d' AND name = 'ledger'",
                (_document("", 30, last_holder="d-run-1"), datetime.now(UTC)),
            )
        again = team_d.replace(
            victim, claimed(team_d.get(victim), "d-run-2", TTL_30S, datetime.now(UTC), "")
        )
        assert read_lease(again).transitions == read_lease(held).transitions + 1
        # A lock of two permits: the permits' rules run under the same plant.
        pool = LeaseRef("team-d", "pool")
        body = {"metadata": {"annotations": {ANNOTATION_PERMITS: "2"}}}
        team_d.create(pool, claimed(body, "d-pool-0", TTL_30S, datetime.now(UTC), ""))
        second = permits.claimed_permit(
            team_d.get(pool), 1, "d-pool-1", TTL_30S, datetime.now(UTC), ""
        )
        assert permits.read_permits(team_d.replace(pool, second))[1].transitions == 1
        with psycopg.connect(store.urls["team-d"], autocommit=True) as raw:
            intruder = permits.claimed_permit(
                team_d.get(pool), 1, "intruder", TTL_30S, datetime.now(UTC), ""
            )
            with pytest.raises(psycopg.DatabaseError, match="permit 1 of the lock is held"):
                raw.execute(
                    "UPDATE cronlock.locks SET document = %s::jsonb, writer_time = %s"
                    " WHERE namespace = 'team-d' AND name = 'pool'",
                    (json.dumps(unversioned(intruder)), datetime.now(UTC)),
                )
    with postgres_store.superuser(store.database) as superuser:
        assert superuser.execute("SELECT who, what FROM public.loot").fetchall() == []
        grants = superuser.execute(
            "SELECT pg_catalog.has_table_privilege('team-c', 'cronlock.locks', 'DELETE'),"
            " pg_catalog.has_table_privilege('team-c', 'cronlock.locks', 'UPDATE')"
        ).fetchone()
        assert grants == (False, False)
    # The plant is live: a call that resolves on team-d's path runs it (as team-d).
    with psycopg.connect(store.urls["team-d"], autocommit=True) as raw:
        assert raw.execute("SELECT make_interval(secs => 5)").fetchone() == (timedelta(seconds=-1),)
    with postgres_store.superuser(store.database) as superuser:
        assert superuser.execute("SELECT who, what FROM public.loot").fetchall() == [
            ("team-d", "make_interval")
        ]


def test_a_tenant_cannot_lock_the_tables_and_its_sessions_are_bounded(
    postgres_store: PostgresServer,
) -> None:
    """N2: `LOCK TABLE` in a mode that stops writers is "permission denied" to a tenant;
    what it may hold (its own rows, the writers' own modes) keeps no other namespace
    waiting; a statement, a wait for a lock and an idle transaction end at the role's
    timeouts, and no more sessions than its connection limit open."""
    store = tenant_store(postgres_store, "lock", ("team-e", "team-f"), revoke_public=True)
    body: dict[str, Any] = {"metadata": {}}
    lease, own = LeaseRef("team-f", "ledger"), LeaseRef("team-e", "mine")
    with transport(store.urls["team-e"]) as team_e:
        team_e.create(own, claimed(body, "e", TTL_30S, datetime.now(UTC), ""))
    with psycopg.connect(store.urls["team-e"], autocommit=True) as attacker:
        for table in ("cronlock.locks", "cronlock.fences"):
            for mode in MODES_THAT_STOP_WRITERS:
                with (
                    pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"),
                    attacker.transaction(),
                ):
                    attacker.execute(f"LOCK TABLE {table} IN {mode} MODE")
        settings = [
            attacker.execute(f"SHOW {name}").fetchone()
            for name in ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
        ]
        assert settings == [("5s",), ("2s",), ("10s",)]
        began = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
            attacker.execute("SELECT pg_catalog.pg_sleep(30)")
        assert 4.5 <= time.monotonic() - began < 10
        # What it may still hold, for as long as it likes (it turns its timeouts off):
        attacker.execute("SET idle_in_transaction_session_timeout = 0")
        attacker.execute("SET statement_timeout = 0")
        with attacker.transaction():
            attacker.execute("LOCK TABLE cronlock.locks IN ROW EXCLUSIVE MODE")
            attacker.execute("LOCK TABLE cronlock.fences IN ROW EXCLUSIVE MODE")
            attacker.execute(
                "SELECT 1 FROM cronlock.locks WHERE namespace = 'team-e' FOR UPDATE"
            ).fetchall()
            began = time.monotonic()
            with transport(store.urls["team-f"]) as team_f:
                team_f.create(lease, claimed(body, "f", TTL_30S, datetime.now(UTC), ""))
                team_f.replace(lease, renewed(team_f.get(lease), TTL_30S, datetime.now(UTC)))
            # Not waiting on the tenant (a wait would have ended in a lock timeout).
            assert time.monotonic() - began < 5
            # Its own row, locked: its own writer gives up at the lock timeout.
            with transport(store.urls["team-e"]) as team_e:
                began = time.monotonic()
                with pytest.raises(Unavailable, match="lock timeout"):
                    team_e.replace(own, renewed(team_e.get(own), TTL_30S, datetime.now(UTC)))
                # The server's 2 s, before the client's own 5 s deadline.
                assert 1.5 <= time.monotonic() - began < 5
    # An idle transaction left open with the role's settings is ended.
    idle = psycopg.connect(store.urls["team-e"])
    try:
        idle.execute("SELECT 1 FROM cronlock.locks").fetchall()
        time.sleep(11)
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            idle.execute("SELECT 1").fetchall()
    finally:
        idle.close()
    # The connection limit: 20 sessions, and the 21st is refused.
    with ExitStack() as sessions:
        for _ in range(20):
            sessions.enter_context(psycopg.connect(store.urls["team-e"], autocommit=True))
        with pytest.raises(psycopg.OperationalError, match="too many connections for role"):
            psycopg.connect(store.urls["team-e"], autocommit=True)


def _document(holder: str, duration: int, *, last_holder: str = "") -> str:
    """A lock's document as a raw statement writes it."""
    moment = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    spec: dict[str, Any] = {"renewTime": moment, "leaseDurationSeconds": duration}
    if holder:
        spec["holderIdentity"] = holder
    notes = {"cronlock.io/last-holder": last_holder} if last_holder else {}
    return json.dumps({"metadata": {"annotations": notes}, "spec": spec})


# --- Permits (docs/DECISIONS.md, "Permits in a store"; the trigger's rules 4) -----------
PERMITS_NAMESPACE = "team-p"


@pytest.fixture(scope="module")
def permits_tenant(postgres_store: PostgresServer) -> TenantStore:
    return tenant_store(postgres_store, "permits", (PERMITS_NAMESPACE,), revoke_public=True)


def lock_of_permits(
    client: PostgresLeaseStore,
    count: int,
    spec: str,
    entries: dict[int, str],
    timing: Timing = TTL_30S,
) -> LeaseRef:
    """A lock of `count` permits made through the store's client: permit 0 held by `spec`
    ("" free), each entry K by its holder, one claim per write as a sidecar makes them."""
    lock = LeaseRef(PERMITS_NAMESPACE, f"permits-{os.urandom(3).hex()}")
    body: dict[str, Any] = {"metadata": {"annotations": {ANNOTATION_PERMITS: str(count)}}}
    client.create(lock, claimed(body, spec, timing, datetime.now(UTC), "") if spec else body)
    for number, holder in entries.items():
        current = client.get(lock)
        client.replace(
            lock, permits.claimed_permit(current, number, holder, timing, datetime.now(UTC), "")
        )
    return lock


def raw_write(url: str, lock: LeaseRef, body: dict[str, Any]) -> None:
    """The tenant's role writes the row itself, the document it chose."""
    with psycopg.connect(url, autocommit=True) as raw:
        raw.execute(
            "UPDATE cronlock.locks SET document = %s::jsonb, writer_time = %s"
            " WHERE namespace = %s AND name = %s",
            (json.dumps(unversioned(body)), datetime.now(UTC), lock.namespace, lock.name),
        )


def holders_of(client: PostgresLeaseStore, lock: LeaseRef) -> list[tuple[str, int]]:
    return [(p.holder, p.transitions) for p in permits.read_permits(client.get(lock))]


def refused(url: str, lock: LeaseRef, body: dict[str, Any], match: str) -> str:
    """The raw write of `body` is refused with `match` in its message; its SQLSTATE."""
    with pytest.raises(psycopg.DatabaseError, match=match) as refusal:
        raw_write(url, lock, body)
    return refusal.value.sqlstate or ""


def test_a_tenant_cannot_take_a_live_permit_or_hold_two(permits_tenant: TenantStore) -> None:
    """Permit 1 held by p-run-2: another holder's write of it is refused (CLK01, worded as
    the holders' policy, naming the permit), raw and through the client; a holder of one
    permit writing itself into another is refused, and nothing changed."""
    url = permits_tenant.urls[PERMITS_NAMESPACE]
    with transport(url) as client:
        lock = lock_of_permits(client, 3, "p-run-1", {1: "p-run-2"})
        now = datetime.now(UTC)
        taken = permits.claimed_permit(client.get(lock), 1, "intruder", TTL_30S, now, "")
        assert refused(url, lock, taken, "permit 1 of the lock is held by p-run-2") == "CLK01"
        with pytest.raises(Forbidden, match="cronlock holder policy: permit 1 of the lock is"):
            client.replace(lock, taken)
        # A holder of permit 0 takes the free permit 2 too, or permit 1's holder does.
        for holder, held in (("p-run-1", 0), ("p-run-2", 1)):
            both = permits.claimed_permit(client.get(lock), 2, holder, TTL_30S, now, "")
            assert (
                refused(url, lock, both, f"{holder} would hold permit {held} and permit 2")
                == "CLK01"
            )
        assert holders_of(client, lock) == [("p-run-1", 1), ("p-run-2", 1), ("", 0)]


def test_a_tenant_cannot_take_two_free_permits_in_one_write(permits_tenant: TenantStore) -> None:
    """Two free permits claimed in one write, on a lock or in its create, are refused; one
    at a time they pass."""
    url = permits_tenant.urls[PERMITS_NAMESPACE]
    now = datetime.now(UTC)
    with transport(url) as client:
        lock = lock_of_permits(client, 3, "", {})
        one = permits.claimed_permit(client.get(lock), 1, "a", TTL_30S, now, "")
        two = permits.claimed_permit(one, 2, "b", TTL_30S, now, "")
        assert refused(url, lock, two, "a write claims one permit") == "CLK01"
        spec_too = claimed(one, "c", TTL_30S, now, "")
        refused(url, lock, spec_too, "a write claims one permit")
        created = LeaseRef(PERMITS_NAMESPACE, f"created-{os.urandom(3).hex()}")
        with pytest.raises(Forbidden, match="a write claims one permit"):
            client.create(created, spec_too)
        with pytest.raises(NotFound):
            client.get(created)
        # (A create spends the spec's first token, with a holder or without.)
        assert holders_of(client, lock) == [("", 1), ("", 0), ("", 0)]
        raw_write(url, lock, one)
        assert holders_of(client, lock) == [("", 1), ("a", 1), ("", 0)]


def test_a_tenant_cannot_move_n_under_holders(permits_tenant: TenantStore) -> None:
    """N raised or lowered while a permit is held is refused (held by permit 0 or by
    permit 1 alone), and N written so that a reader could take it for another number; once
    every permit is free, N moves."""
    url = permits_tenant.urls[PERMITS_NAMESPACE]
    now = datetime.now(UTC)
    with transport(url) as client:
        lock = lock_of_permits(client, 2, "p-run-1", {1: "p-run-2"})
        for count in ("3", "1", "16"):
            moved = noted(client.get(lock), ANNOTATION_PERMITS, count)
            refused(url, lock, moved, f"N changes from 2 to {count} only while no permit")
        for text in (" 2", "02", "2\n", "3 "):
            refused(url, lock, noted(client.get(lock), ANNOTATION_PERMITS, text), "digits alone")
        client.replace(lock, released(client.get(lock), "p-run-1", now))
        alone = noted(client.get(lock), ANNOTATION_PERMITS, "1")  # permit 1 still held
        refused(url, lock, alone, "permit 1 is held by p-run-2")
        client.replace(lock, permits.released_permit(client.get(lock), 1, "p-run-2", now))
        raw_write(url, lock, noted(client.get(lock), ANNOTATION_PERMITS, "3"))
        assert permits.permits_of(client.get(lock)) == 3


def test_a_tenants_forged_tokens_and_renewals_are_not_what_readers_get(
    permits_tenant: TenantStore,
) -> None:
    """A write naming permit 1's holder may renew it (the store cannot tell them apart),
    but the transitions and renew time it writes are ignored: readers get the store's
    token and its own time of the renewal, so the permit still expires after its
    duration; the next holder's token is one more than the store's, not the forged one's.
    The per-permit records column is the trigger's: a tenant may not update it, and what
    it inserts there is replaced."""
    url = permits_tenant.urls[PERMITS_NAMESPACE]
    with transport(url) as client:
        lock = lock_of_permits(client, 2, "p-run-1", {1: "p-run-2"}, TTL_1S)
        current = client.get(lock)
        entry = permits.read_entry(1, current["metadata"]["annotations"]["cronlock.io/permit.1"])
        ahead = datetime.now(UTC) + timedelta(days=365)
        forged = entry._replace(renew_time=ahead, transitions=999)
        body = noted(current, "cronlock.io/permit.1", forged.text())
        raw_write(url, lock, body)
        read = permits.read_permits(client.get(lock))[1]
        assert (read.holder, read.transitions) == ("p-run-2", 1)
        assert read.renew_time is not None
        assert read.renew_time <= datetime.now(UTC) + timedelta(seconds=1)
        time.sleep(1.5)  # the 1 s the entry names passes on the store's clock
        client.replace(
            lock,
            permits.claimed_permit(client.get(lock), 1, "next", TTL_30S, datetime.now(UTC), ""),
        )
        assert holders_of(client, lock)[1] == ("next", 2)
    with psycopg.connect(url, autocommit=True) as raw:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            raw.execute(
                "UPDATE cronlock.locks SET permits = '{}' WHERE namespace = %s AND name = %s",
                (lock.namespace, lock.name),
            )
        inserted = LeaseRef(PERMITS_NAMESPACE, f"inserted-{os.urandom(3).hex()}")
        body = {"metadata": {"annotations": {ANNOTATION_PERMITS: "2"}}}
        body = permits.claimed_permit(body, 1, "i-run", TTL_30S, datetime.now(UTC), "")
        raw.execute(
            "INSERT INTO cronlock.locks (namespace, name, holder, transitions, resource_version,"
            " document, writer_time, written_at, permits) VALUES (%s, %s, '', 0, 0, %s::jsonb,"
            " pg_catalog.now(), pg_catalog.now(), %s::jsonb)",
            (
                inserted.namespace,
                inserted.name,
                json.dumps(body),
                json.dumps({"1": {"token": 1000, "renewed_at": "2999-01-01T00:00:00+00:00"}}),
            ),
        )
        row = raw.execute(
            "SELECT (permits #>> '{1,token}')::bigint,"
            " (permits #>> '{1,renewed_at}')::timestamptz <= pg_catalog.clock_timestamp()"
            " FROM cronlock.locks WHERE namespace = %s AND name = %s",
            (inserted.namespace, inserted.name),
        ).fetchone()
    assert row == (1, True)


def test_a_claims_tick_record_names_the_claimed_permits_holder(
    permits_tenant: TenantStore,
) -> None:
    """A claim of permit 1 whose tick record names permit 0's holder is refused; naming
    its own holder it passes, and a renewal of permit 0 carries it."""
    url = permits_tenant.urls[PERMITS_NAMESPACE]
    now = datetime.now(UTC)
    tick = now.replace(second=0, microsecond=0)
    with transport(url) as client:
        lock = lock_of_permits(client, 2, "p-run-1", {})
        for holder, allowed in (("p-run-1", False), ("p-run-2", True)):
            record = TickRecord("nightly", tick, "nightly-1", f"uid-{holder}", holder, "")
            claim = permits.claimed_permit(client.get(lock), 1, "p-run-2", TTL_30S, now, "", record)
            if allowed:
                raw_write(url, lock, claim)
            else:
                refused(url, lock, claim, "it names holder p-run-1, not the claim's p-run-2")
        assert holders_of(client, lock) == [("p-run-1", 1), ("p-run-2", 1)]
        client.replace(lock, renewed(client.get(lock), TTL_30S, datetime.now(UTC)))


def test_a_permits_later_pod_of_its_job_takes_it_and_only_its_release_writes_success(
    permits_tenant: TenantStore,
) -> None:
    """Permit 1 held by a pod of the Job nightly-7: a later pod of that Job takes it over
    live (the entry's Job field, the spec's prefix rule), a pod of another name is refused
    with the same Job field. The success record is written by the one permit released, as
    that holder's own claim record: permit 0's holder releasing with permit 1's record is
    refused, permit 1's holder releasing with it passes."""
    url = permits_tenant.urls[PERMITS_NAMESPACE]
    now = datetime.now(UTC)
    tick = now.replace(second=0, microsecond=0)
    with transport(url) as client:
        lock = lock_of_permits(client, 2, "p-run-1", {})
        first = TickRecord("nightly", tick, "nightly-7", "uid-7", "nightly-7-aaaaa", "")
        client.replace(
            lock,
            permits.claimed_permit(
                client.get(lock), 1, "nightly-7-aaaaa", TTL_30S, now, "nightly-7", first
            ),
        )
        other = permits.claimed_permit(
            client.get(lock), 1, "weekly-7-bbbbb", TTL_30S, now, "nightly-7"
        )
        refused(url, lock, other, "permit 1 of the lock is held by nightly-7-aaaaa")
        retry = first._replace(holder="nightly-7-ccccc")
        client.replace(
            lock,
            permits.claimed_permit(
                client.get(lock), 1, "nightly-7-ccccc", TTL_30S, now, "nightly-7", retry
            ),
        )
        assert holders_of(client, lock) == [("p-run-1", 1), ("nightly-7-ccccc", 2)]
        wrong = released(client.get(lock), "p-run-1", now, success=retry)
        refused(url, lock, wrong, "not the releasing holder's own claim record")
        client.replace(
            lock,
            permits.released_permit(client.get(lock), 1, "nightly-7-ccccc", now, success=retry),
        )
        notes = client.get(lock)["metadata"]["annotations"]
        assert notes["cronlock.io/succeeded.nightly"] == retry.text()


def noted(body: dict[str, Any], key: str, value: str) -> dict[str, Any]:
    """`body` with the annotation `key` set to `value`."""
    written = copy.deepcopy(body)
    written.setdefault("metadata", {}).setdefault("annotations", {})[key] = value
    return written
