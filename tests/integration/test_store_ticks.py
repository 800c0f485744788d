"""The stores' own rules for tick records, attacked from a tenant's side (issue 56 item 1).

Each store is set up exactly as docs/STORES.md says: Redis with the admin's library and
load blocks and the per-namespace ACL line, PostgreSQL with the owner, schema, row-level
security, role and grant blocks. The tenant writes with its own namespace's credential
through the store's client, as a sidecar would, documents it builds itself (annotations
made by `ticks.with_record`): what breaks "each tick at most once" is refused with a
`cronlock store: tick record ...` line (Forbidden in the sidecar, exit 69), the records on
the lock stay as they were, and the legitimate claim, renewal, release and takeover pass
on the same set-up.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from cronlock_sidecar.contract import ANNOTATION_SUCCEEDED_PREFIX
from cronlock_sidecar.lock import ticks
from cronlock_sidecar.lock.model import Timing, claimed, read_lease, released, renewed
from cronlock_sidecar.stores.documents import TICK_AHEAD_SECONDS, unversioned
from cronlock_sidecar.stores.pgstore import PostgresLeaseStore
from cronlock_sidecar.stores.redisstore import (
    FUNCTIONS,
    LIBRARY_NAME,
    RedisLeaseStore,
    keys,
    micros,
)
from cronlock_sidecar.stores.url import parse_store_url
from cronlock_sidecar.transport.seam import Forbidden, LeaseRef, NotFound
from tests.integration.test_postgres_tenants import statements, tenant_store
from tests.integration.test_redis_tenants import (
    add_user,
    documented,
    frozen,
    load_as_documented,
)
from tests.support.paths import ROOT
from tests.support.stores import PostgresServer, RedisServer, running

HERE = Path(__file__).parent
UPGRADING_MD = ROOT / "docs" / "UPGRADING.md"
LIBRARY_V1 = (HERE / "redis_library_v1.lua").read_text()
LIBRARY_V2 = (HERE / "redis_library_v2.lua").read_text()
SCHEMA_3 = (HERE / "pg_schema_3.sql").read_text()
# What a sidecar of the release before checks before it runs its own schema text.
SCHEMA_3_PRESENT = """
SELECT coalesce(pg_catalog.obj_description(pg_catalog.to_regclass('cronlock.locks'), 'pg_class'),
                '') LIKE 'cronlock locks, schema 3 %'
"""
NAMESPACE = "tick-a"  # the tenant; its role (PostgreSQL) or ACL user (Redis) is its own
CRONJOB = "nightly"
TTL_30S = Timing.of(30.0, None, 1.0)
TTL_1S = Timing.of(1.0, None, 0.0)
SKEW = 1.0


@dataclass
class Tenant:
    kind: str
    url: str  # the namespace's credential, as its Secret holds it
    admin_url: str

    def client(self) -> RedisLeaseStore | PostgresLeaseStore:
        """The store's client as the namespace's sidecar makes it."""
        url = parse_store_url(self.url, "--store")
        if self.kind == "redis":
            return RedisLeaseStore(url, lambda: datetime.now(UTC), 5.0)
        return PostgresLeaseStore(url, lambda: datetime.now(UTC), 5.0)


@pytest.fixture(scope="module")
def redis_tenant(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenant]:
    with running("redis") as server:
        assert isinstance(server, RedisServer)
        load_as_documented(server, tmp_path_factory.mktemp("admin"))
        yield Tenant("redis", add_user(server, NAMESPACE, documented("redis-acl")), server.url)


@pytest.fixture(scope="module")
def postgres_tenant(postgres_store: PostgresServer) -> Tenant:
    store = tenant_store(postgres_store, "ticks", (NAMESPACE,), revoke_public=True)
    return Tenant("postgres", store.urls[NAMESPACE], store.admin_url)


@pytest.fixture(params=["redis", "postgres"])
def tenant(request: pytest.FixtureRequest) -> Tenant:
    found = request.getfixturevalue(f"{request.param}_tenant")
    assert isinstance(found, Tenant)
    return found


def whole(seconds_from_now: float) -> datetime:
    """A tick `seconds_from_now` away, in whole seconds."""
    return (datetime.now(UTC) + timedelta(seconds=seconds_from_now)).replace(microsecond=0)


def noted(body: dict[str, Any], record: ticks.TickRecord) -> dict[str, Any]:
    """`body` with `record` as its CronJob's tick record."""
    written = copy.deepcopy(body)
    metadata = written.setdefault("metadata", {})
    metadata["annotations"] = ticks.with_record(metadata.get("annotations") or {}, record)
    return written


def without(body: dict[str, Any], cronjob: str) -> dict[str, Any]:
    """`body` without `cronjob`'s tick record."""
    written = copy.deepcopy(body)
    written["metadata"]["annotations"].pop(ticks.record_key(cronjob))
    return written


def record(at: datetime, run: str, holder: str, cronjob: str = CRONJOB) -> ticks.TickRecord:
    return ticks.TickRecord(cronjob, at, f"{cronjob}-{int(at.timestamp()) // 60}", run, holder, "")


def on_lock(client: RedisLeaseStore | PostgresLeaseStore, lock: LeaseRef) -> set[str]:
    """The tick records on the lock, as text."""
    annotations = (client.get(lock).get("metadata") or {}).get("annotations") or {}
    return {f"{found.cronjob}={found.text()}" for found in ticks.records(annotations)}


def as_text(*records: ticks.TickRecord) -> set[str]:
    return {f"{found.cronjob}={found.text()}" for found in records}


def fresh(name: str) -> LeaseRef:
    return LeaseRef(NAMESPACE, f"{name}-{os.urandom(3).hex()}")


def test_claims_write_records_and_every_other_write_carries_them(tenant: Tenant) -> None:
    """The sidecar's own writes: a claim with two CronJobs' records, its renewal, a retry
    pod of the same Job (same run) taking the expired hold with the same tick, its release,
    the next tick's claim, a takeover of an expired hold that carries both records, and a
    freeze written on it (`cronlock freeze --store-secret`)."""
    lock = fresh("legit")
    first = record(whole(-180), "uid-1", "pod-1")
    weekly = record(whole(-600), "uid-w", "pod-1", "weekly")
    with tenant.client() as client:
        body = claimed({"metadata": {}}, "pod-1", TTL_1S, datetime.now(UTC), first.job)
        client.create(lock, noted(noted(body, first), weekly))
        client.replace(lock, renewed(client.get(lock), TTL_1S, datetime.now(UTC)))
        time.sleep(1.2)  # pod-1's second passes on the store's clock
        retry = first._replace(holder="pod-1b")
        read = client.get(lock)
        client.replace(
            lock, noted(claimed(read, "pod-1b", TTL_1S, datetime.now(UTC), first.job), retry)
        )
        client.replace(lock, released(client.get(lock), "pod-1b", datetime.now(UTC)))
        second = record(whole(-120), "uid-2", "pod-2")
        read = client.get(lock)
        client.replace(
            lock, noted(claimed(read, "pod-2", TTL_1S, datetime.now(UTC), second.job), second)
        )
        time.sleep(1.2)
        taken = client.replace(
            lock, claimed(client.get(lock), "pod-3", TTL_30S, datetime.now(UTC), "")
        )
        assert read_lease(taken).holder == "pod-3"
        client.replace(lock, frozen(client.get(lock)))
        assert read_lease(client.get(lock)).frozen_until is not None
        assert on_lock(client, lock) == as_text(second, weekly)


def refused(
    client: RedisLeaseStore | PostgresLeaseStore, lock: LeaseRef, body: dict[str, Any], why: str
) -> None:
    """The write is refused for the tick rule `why`, and nothing on the lock changes."""
    before = client.get(lock)
    with pytest.raises(Forbidden, match=f"cronlock store: tick record .*: {re.escape(why)}"):
        client.replace(lock, body)
    after = client.get(lock)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_a_tenant_cannot_rewrite_ticks_with_the_stores_credential(tenant: Tenant) -> None:
    """Naming the live holder (a renewal or a release) the tenant changes or drops the
    record; claiming the free lock it writes a far-future tick, an older one, the same tick
    with another run id, a record naming another holder, one that is no record, or drops
    the record; creating a lock it writes a far-future tick. Every one is refused, the
    victim's record stays, and the next tick's claim passes."""
    lock = fresh("attacked")
    mine = record(whole(-120), "uid-victim", "victim")
    with tenant.client() as client:
        body = claimed({"metadata": {}}, "victim", TTL_30S, datetime.now(UTC), mine.job)
        client.create(lock, noted(body, mine))
        held = client.get(lock)

        def renewal(changed: ticks.TickRecord) -> dict[str, Any]:
            return noted(renewed(held, TTL_30S, datetime.now(UTC)), changed)

        only_a_claim = "only a claim (a new holder) writes one"
        refused(client, lock, renewal(mine._replace(at=whole(-60))), only_a_claim)
        refused(client, lock, renewal(mine._replace(run="uid-evil")), only_a_claim)
        drops = "every write carries it"
        refused(client, lock, without(renewed(held, TTL_30S, datetime.now(UTC)), CRONJOB), drops)
        release = released(held, "victim", datetime.now(UTC))
        refused(client, lock, without(release, CRONJOB), drops)
        refused(client, lock, noted(release, mine._replace(at=whole(-60))), only_a_claim)
        assert on_lock(client, lock) == as_text(mine)

        client.replace(lock, released(client.get(lock), "victim", datetime.now(UTC)))
        free = client.get(lock)

        def claim(written: ticks.TickRecord | None, holder: str = "evil") -> dict[str, Any]:
            body = claimed(free, holder, TTL_30S, datetime.now(UTC), "")
            return body if written is None else noted(body, written)

        ahead = f"its tick is more than {TICK_AHEAD_SECONDS} s ahead of the store's clock"
        for future in (whole(3600), whole(400 * 86400), whole(TICK_AHEAD_SECONDS + 30)):
            refused(client, lock, claim(record(future, "uid-evil", "evil")), ahead)
        older = record(whole(-180), "uid-evil", "evil")
        refused(client, lock, claim(older), "its tick is older than the recorded one")
        again = mine._replace(run="uid-evil", holder="evil")
        refused(client, lock, claim(again), "its tick was claimed by another run (uid-victim)")
        refused(
            client, lock, claim(mine._replace(at=whole(-60))), "it names holder victim, not the"
        )
        garbage = noted(claim(None), mine)
        garbage["metadata"]["annotations"][ticks.record_key(CRONJOB)] = "tomorrow uid-evil evil"
        refused(client, lock, garbage, "not <tick> <job|-> <run> <holder> <cluster|->")
        refused(client, lock, without(claim(None), CRONJOB), drops)
        assert on_lock(client, lock) == as_text(mine)

        elsewhere = fresh("created")
        future = record(whole(3600), "uid-evil", "evil")
        body = claimed({"metadata": {}}, "evil", TTL_30S, datetime.now(UTC), "")
        with pytest.raises(Forbidden, match=ahead):
            client.create(elsewhere, noted(body, future))
        with pytest.raises(NotFound):
            client.get(elsewhere)

        following = record(whole(-60), "uid-next", "next")
        client.replace(lock, claim(following, "next"))
        assert on_lock(client, lock) == as_text(following)


def test_two_runs_of_one_tick_work_it_once(tenant: Tenant) -> None:
    """Two clusters' runs of the 12:00 tick on one store lock, as two sidecars write it:
    a's claims, works and releases; b's reads a's record and skips (`already ran`); b's
    claim written anyway is refused by the store; the next tick's run claims."""
    lock = fresh("two-clusters")
    at = whole(-60).replace(second=0)  # this tick and the next are both past
    job = f"{CRONJOB}-{int(at.timestamp()) // 60}"
    run_a = ticks.Tick(CRONJOB, at, job, "uid-a")
    run_b = ticks.Tick(CRONJOB, at, job, "uid-b")
    with tenant.client() as cluster_a, tenant.client() as cluster_b:
        body = claimed({"metadata": {}}, "pod-a", TTL_30S, datetime.now(UTC), job)
        cluster_a.create(lock, noted(body, ticks.record_of(run_a, "pod-a", "a")))
        cluster_a.replace(lock, released(cluster_a.get(lock), "pod-a", datetime.now(UTC)))

        read = cluster_b.get(lock)
        found = ticks.read_record(read["metadata"]["annotations"], CRONJOB)
        claimer = ticks.already_ran(run_b, found, datetime.now(UTC), SKEW)
        assert claimer is not None
        assert claimer.run == "uid-a"
        assert ticks.skip_line(run_b, claimer, str(lock)).startswith("already ran: tick ")
        anyway = noted(
            claimed(read, "pod-b", TTL_30S, datetime.now(UTC), job),
            ticks.record_of(run_b, "pod-b", "b"),
        )
        with pytest.raises(Forbidden, match=r"its tick was claimed by another run \(uid-a\)"):
            cluster_b.replace(lock, anyway)

        following = ticks.Tick(CRONJOB, at + timedelta(minutes=1), f"{CRONJOB}-next", "uid-b2")
        assert ticks.already_ran(following, found, datetime.now(UTC), SKEW) is None
        taken = cluster_b.replace(
            lock,
            noted(
                claimed(read, "pod-b2", TTL_30S, datetime.now(UTC), following.job),
                ticks.record_of(following, "pod-b2", "b"),
            ),
        )
        assert read_lease(taken).holder == "pod-b2"


def victims_hold(tenant: Tenant, name: str) -> tuple[LeaseRef, ticks.TickRecord]:
    """A fresh lock held by "victim", its claim record written: what a raw update attacks."""
    lock = fresh(name)
    mine = record(whole(-60), "uid-victim", "victim")
    with tenant.client() as client:
        body = claimed({"metadata": {}}, "victim", TTL_30S, datetime.now(UTC), mine.job)
        client.create(lock, noted(body, mine))
    return lock, mine


def raw_annotation(tenant: Tenant, lock: LeaseRef, key: str, value: str, refusal: str) -> None:
    """The tenant's role sets annotation `key` of the lock's row itself (`jsonb_set`; its
    column grants allow `document`): the trigger refuses it, saying `refusal`."""
    with (
        psycopg.connect(tenant.url, autocommit=True) as raw,
        pytest.raises(psycopg.errors.CheckViolation, match=refusal),
    ):
        raw.execute(
            "UPDATE cronlock.locks SET document = jsonb_set(document, "
            "ARRAY['metadata', 'annotations', %s], to_jsonb(%s::text)) "
            "WHERE namespace = %s AND name = %s",
            (key, value, lock.namespace, lock.name),
        )


def test_postgres_raw_updates_keep_the_tick_rules(postgres_tenant: Tenant) -> None:
    """The tenant's role writes the row itself: a far-future tick set on the live hold is
    refused by the trigger."""
    lock, mine = victims_hold(postgres_tenant, "raw")
    future = mine._replace(at=whole(86400)).text()
    raw_annotation(postgres_tenant, lock, "cronlock.io/tick.nightly", future, "only a claim")
    with postgres_tenant.client() as client:
        assert on_lock(client, lock) == as_text(mine)


def test_a_schema_3_database_gets_the_tick_rules(postgres_store: PostgresServer) -> None:
    """A database the release before set up (schema 3, its trigger without tick rules):
    there a far-future tick is written (the control). A namespace's sidecar of this release
    runs nothing there (exit 69, the pointer to the schema) until the schema is run again;
    the first sidecar whose role may run it does: the same write is then refused, and the
    table still says schema 3, so a sidecar of the release before never puts its trigger
    back."""
    admin, database, password = "cronlock_admin_s3", "ticks_s3", os.urandom(8).hex()
    owner = (
        documented("postgres-owner")
        .replace("cronlock_admin", admin)
        .replace("DATABASE cronlock ", f"DATABASE {database} ")
        .replace("'PASSWORD'", f"'{password}'")
    )
    with postgres_store.superuser() as superuser:
        for statement in statements(owner):
            superuser.execute(statement)
    url = postgres_store.url_of(admin, password, database)
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(SCHEMA_3)
        connection.execute(documented("postgres-rls-once"))
    secret = os.urandom(8).hex()
    with postgres_store.superuser(database) as superuser:
        role = documented("postgres-rls-role").replace("team-a", "tick-s3")
        superuser.execute(role.replace("'PASSWORD'", f"'{secret}'"))
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(documented("postgres-rls-namespace").replace("team-a", "tick-s3"))
    tenant = PostgresLeaseStore(
        parse_store_url(postgres_store.url_of("tick-s3", secret, database), "--store"),
        lambda: datetime.now(UTC),
    )
    with tenant, pytest.raises(Forbidden, match="the admin role runs the schema") as refusal:
        tenant.get(LeaseRef("tick-s3", "upgraded"))
    assert "permission denied for schema cronlock" in str(refusal.value)
    lock = LeaseRef("team-s3", "upgraded")
    future = record(whole(86400), "uid-evil", "evil")
    # The release before's sidecar writes the row with its own statements (this release's
    # read and write the trigger's per-permit records too, a column schema 3 lacks).
    with psycopg.connect(url, autocommit=True) as before:
        body = claimed({"metadata": {}}, "evil", TTL_1S, datetime.now(UTC), "")
        before.execute(
            "INSERT INTO cronlock.locks (namespace, name, holder, transitions,"
            " resource_version, document, writer_time, written_at)"
            " VALUES (%s, %s, '', 0, 0, %s::jsonb, %s, pg_catalog.now())",
            (lock.namespace, lock.name, json.dumps(noted(body, future)), datetime.now(UTC)),
        )
        row = before.execute(
            "SELECT document FROM cronlock.locks WHERE namespace = %s AND name = %s",
            (lock.namespace, lock.name),
        ).fetchone()
    assert row is not None
    written = ticks.records(row[0]["metadata"]["annotations"])
    assert {f"{found.cronjob}={found.text()}" for found in written} == as_text(future)
    with PostgresLeaseStore(parse_store_url(url, "--store"), lambda: datetime.now(UTC)) as after:
        time.sleep(1.2)  # evil's second passes
        read = after.get(lock)  # connected: the schema ran again
        later = record(whole(86400 * 2), "uid-evil2", "evil2")
        with pytest.raises(Forbidden, match="more than 60 s ahead of the store's clock"):
            after.replace(lock, noted(claimed(read, "evil2", TTL_1S, datetime.now(UTC), ""), later))
        # The recorded far-future tick is nobody's: the next tick's claim replaces it.
        mine = record(whole(-60), "uid-1", "pod-1")
        after.replace(lock, noted(claimed(read, "pod-1", TTL_30S, datetime.now(UTC), ""), mine))
        assert on_lock(after, lock) == as_text(mine)
    with psycopg.connect(url, autocommit=True) as connection:
        row = connection.execute(SCHEMA_3_PRESENT).fetchone()
    assert row is not None
    assert row[0] is True


def test_version_1_beside_version_2_until_the_admin_deletes_it(redis_tenant: Tenant) -> None:
    """During an upgrade the admin loads version 2 beside version 1 (both fleets run):
    meanwhile the tenant may call version 1, which keeps no tick rules (the control: a
    far-future tick written), which is why docs/UPGRADING.md deletes it at the end; after
    `FUNCTION DELETE cronlock_v1` that call is refused, version 2 refuses the write, and
    the far-future record version 1 left is nobody's: the current tick's claim replaces it."""
    lock = fresh("v1")
    future = record(whole(86400), "uid-evil", "evil")
    with redis.Redis.from_url(redis_tenant.admin_url, decode_responses=True) as admin:
        admin.function_load(LIBRARY_V1)
    try:
        with redis_tenant.client() as client:
            body = claimed({"metadata": {}}, "evil", TTL_1S, datetime.now(UTC), "")
            with pytest.raises(Forbidden, match="more than 60 s ahead"):
                client.create(lock, noted(body, future))
            document = json.dumps(noted(body, future), separators=(",", ":"))
            now = micros(datetime.now(UTC))
            with redis.Redis.from_url(redis_tenant.url, decode_responses=True) as raw:
                answer = raw.fcall(
                    "cronlock_v1_create", 3, *keys(lock)[:3], document, now, "0", "60000"
                )
                assert answer[0] == "ok"
            assert on_lock(client, lock) == as_text(future)
    finally:
        with redis.Redis.from_url(redis_tenant.admin_url, decode_responses=True) as admin:
            admin.execute_command(*shlex.split(documented("redis-delete-v1", UPGRADING_MD)))
    with (
        redis.Redis.from_url(redis_tenant.url, decode_responses=True) as raw,
        pytest.raises(redis.ResponseError, match="Function not found"),
    ):
        raw.fcall("cronlock_v1_replace", 3, *keys(lock)[:3], document, now, "0", "60000", "1")
    assert FUNCTIONS["replace"] == f"{LIBRARY_NAME}_replace" == "cronlock_v4_replace"
    # The far-future tick left by version 1 is nobody's: once evil's second passed, the
    # current tick's claim replaces it.
    time.sleep(1.2)
    with redis_tenant.client() as client:
        mine = record(whole(-60), "uid-1", "pod-1")
        read = client.get(lock)
        client.replace(lock, noted(claimed(read, "pod-1", TTL_30S, datetime.now(UTC), ""), mine))
        assert on_lock(client, lock) == as_text(mine)


# --- success records (issue 56 item 3): only the holder's release, its own claim -------
SUCCESS_KEY = ANNOTATION_SUCCEEDED_PREFIX + CRONJOB


def succeeded(body: dict[str, Any], success: ticks.TickRecord) -> dict[str, Any]:
    """`body` with `success` as its CronJob's success record."""
    written = copy.deepcopy(body)
    metadata = written.setdefault("metadata", {})
    notes = metadata.get("annotations") or {}
    metadata["annotations"] = ticks.with_record(notes, success, ANNOTATION_SUCCEEDED_PREFIX)
    return written


def success_on(client: RedisLeaseStore | PostgresLeaseStore, lock: LeaseRef) -> str | None:
    annotations = (client.get(lock).get("metadata") or {}).get("annotations") or {}
    found = annotations.get(SUCCESS_KEY)
    return found if isinstance(found, str) else None


def refused_success(
    client: RedisLeaseStore | PostgresLeaseStore,
    lock: LeaseRef,
    body: dict[str, Any],
    why: str,
    *,
    create: bool = False,
) -> None:
    """The write is refused for the success rule `why`, and nothing on the lock changes."""
    before = None if create else client.get(lock)
    match = f"cronlock store: success record {re.escape(SUCCESS_KEY)}: {re.escape(why)}"
    write = client.create if create else client.replace
    with pytest.raises(Forbidden, match=match):
        write(lock, body)
    if before is None:
        with pytest.raises(NotFound):
            client.get(lock)
    else:
        after = client.get(lock)
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_a_tenant_marks_success_only_for_the_tick_it_claimed_and_only_by_its_release(
    tenant: Tenant,
) -> None:
    """Naming the live holder, the tenant writes a success in a renewal, in a release for
    another run's tick, a far-future tick, its claim's tick with another run id, or in a
    claim or a create; it drops a recorded success in a renewal and in a claim. Each is
    refused with its rule's line and changes nothing; the holder's release writing its own
    claim record passes on the same set-up, and the next tick's claim carries it."""
    lock = fresh("success")
    mine = record(whole(-120), "uid-victim", "victim")
    with tenant.client() as client:
        body = claimed({"metadata": {}}, "victim", TTL_30S, datetime.now(UTC), mine.job)
        client.create(lock, noted(body, mine))
        held = client.get(lock)
        release = released(held, "victim", datetime.now(UTC))
        only_release = "only the holder's release writes one"
        not_own = "it is not the releasing holder's own claim record (its tick and run)"
        renewal = renewed(held, TTL_30S, datetime.now(UTC))
        refused_success(client, lock, succeeded(renewal, mine), only_release)
        for forged in (
            record(whole(-60), "uid-evil", "victim"),  # another run's (newer) tick
            mine._replace(run="uid-evil"),  # the claim's tick, another run id
            mine._replace(at=whole(400 * 86400)),  # far ahead
            mine._replace(at=whole(-600)),  # an older tick
        ):
            refused_success(client, lock, succeeded(release, forged), not_own)
        assert success_on(client, lock) is None

        # The holder's release with its own claim record: the legitimate write passes.
        client.replace(lock, succeeded(release, mine))
        assert success_on(client, lock) == mine.text()

        # No write drops it, and no claim writes one.
        free = client.get(lock)
        following = record(whole(-60), "uid-next", "next")
        claim = noted(claimed(free, "next", TTL_30S, datetime.now(UTC), ""), following)
        dropped = copy.deepcopy(claim)
        dropped["metadata"]["annotations"].pop(SUCCESS_KEY)
        refused_success(client, lock, dropped, "every write carries it")
        refused_success(client, lock, succeeded(claim, following), only_release)
        client.replace(lock, claim)
        assert success_on(client, lock) == mine.text()
        held = client.get(lock)
        renewal = renewed(held, TTL_30S, datetime.now(UTC))
        del renewal["metadata"]["annotations"][SUCCESS_KEY]
        refused_success(client, lock, renewal, "every write carries it")
        # The next holder's release may move it to its own claim, newer.
        client.replace(lock, succeeded(released(held, "next", datetime.now(UTC)), following))
        assert success_on(client, lock) == following.text()

        elsewhere = fresh("success-created")
        body = claimed({"metadata": {}}, "evil", TTL_30S, datetime.now(UTC), "")
        created = succeeded(noted(body, record(whole(-60), "uid-e", "evil")), mine)
        refused_success(client, elsewhere, created, only_release, create=True)


def test_postgres_raw_updates_keep_the_success_rules(postgres_tenant: Tenant) -> None:
    """The tenant's role sets a success record on the live hold itself: refused."""
    lock, mine = victims_hold(postgres_tenant, "raw-success")
    key = "cronlock.io/succeeded.nightly"
    raw_annotation(postgres_tenant, lock, key, mine.text(), "only the holder's release")
    with postgres_tenant.client() as client:
        assert success_on(client, lock) is None


def test_version_2_beside_version_3_until_the_admin_deletes_it(redis_tenant: Tenant) -> None:
    """During the upgrade version 2 is loaded beside version 3: through it a tenant marks
    another run's tick a success (the control), which version 3 refuses; after
    docs/UPGRADING.md's `FUNCTION DELETE cronlock_v2` that call is refused."""
    lock = fresh("v2")
    mine = record(whole(-60), "uid-victim", "victim")
    forged = record(whole(-30), "uid-evil", "evil")
    with redis.Redis.from_url(redis_tenant.admin_url, decode_responses=True) as admin:
        admin.function_load(LIBRARY_V2)
    try:
        with redis_tenant.client() as client:
            body = claimed({"metadata": {}}, "victim", TTL_30S, datetime.now(UTC), mine.job)
            client.create(lock, noted(body, mine))
            held = client.get(lock)
            release = succeeded(released(held, "victim", datetime.now(UTC)), forged)
            refused_success(
                client, lock, release, "it is not the releasing holder's own claim record"
            )
            document = json.dumps(unversioned(release), separators=(",", ":"))
            version = str(held["metadata"]["resourceVersion"])
            now = micros(datetime.now(UTC))
            with redis.Redis.from_url(redis_tenant.url, decode_responses=True) as raw:
                answer = raw.fcall(
                    "cronlock_v2_replace", 3, *keys(lock)[:3], document, now, "0", "60000", version
                )
                assert answer[0] == "ok", answer
            assert success_on(client, lock) == forged.text()
    finally:
        with redis.Redis.from_url(redis_tenant.admin_url, decode_responses=True) as admin:
            admin.execute_command(*shlex.split(documented("redis-delete-v2", UPGRADING_MD)))
    with (
        redis.Redis.from_url(redis_tenant.url, decode_responses=True) as raw,
        pytest.raises(redis.ResponseError, match="Function not found"),
    ):
        raw.fcall("cronlock_v2_replace", 3, *keys(lock)[:3], document, now, "0", "60000", "1")
