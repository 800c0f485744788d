"""The lock in Redis and PostgreSQL, on real servers started by the tests (tests/support/stores.py).

Each test runs against both stores: `cronlock-sidecar run --store` as a user runs it, and
the transports' compare-and-set and fencing directly where a test needs to reach behind
the command (deleting a lock by hand, as an admin might).
"""

from __future__ import annotations

import json
import os
import shlex
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
from cronlock_sidecar.stores import pgstore, redisstore
from cronlock_sidecar.stores.pgstore import PostgresLeaseStore
from cronlock_sidecar.stores.redisstore import RedisLeaseStore, keys
from cronlock_sidecar.stores.url import parse_store_url
from cronlock_sidecar.transport.seam import Conflict, Forbidden, LeaseRef, NotFound, Unavailable
from tests.support.kube import wait_for
from tests.support.paths import ROOT, SIDECAR
from tests.support.stores import PostgresServer, RedisServer, documented
from tests.support.timing import SLACK, Bound

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
    started, release = tmp_path / "started", tmp_path / "release"
    # The holder holds until the second run has decided (no fixed work window: issue 55).
    holder = start_run(
        server.url,
        lock,
        [
            "sh",
            "-c",
            f'echo "$CRONLOCK_FENCING_TOKEN" > {started}; '
            f"until [ -e {release} ]; do sleep 0.05; done",
        ],
        "--ttl",
        "6s",
    )
    first_token = int(wait_for_line(started))
    second = start_run(server.url, lock, ["sh", "-c", "echo SECOND RAN"], "--ttl", "6s")
    try:
        out, err = second.communicate(timeout=30)
    finally:
        release.touch()
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
    started, release = tmp_path / "started", tmp_path / "release"
    # The holder works until both contenders have decided, however slowly they start (a
    # fixed `sleep 4` ended first on a loaded machine, and the one behind found it free).
    holding = f"echo up > {started}; while [ ! -e {release} ]; do sleep 0.1; done"
    holder = start_run(server.url, lock, ["sh", "-c", holding], "--ttl", "6s")
    try:
        wait_for_line(started)
        ahead = start_run(
            server.url, lock, ["sh", "-c", "echo AHEAD RAN"], "--ttl", "6s", skewed=30.0
        )
        out, err = ahead.communicate(timeout=30)
        assert ahead.returncode == 75, err
        assert "AHEAD RAN" not in out
        behind = start_run(
            server.url, lock, ["sh", "-c", "echo BEHIND RAN"], "--ttl", "6s", skewed=-30.0
        )
        out, err = behind.communicate(timeout=30)
        assert behind.returncode == 75, err
        assert "BEHIND RAN" not in out
        assert holder.poll() is None, "the holder was never disturbed"
    finally:
        release.touch()
        holder.communicate(timeout=30)
    assert holder.returncode == 0


def test_a_paused_store_stops_the_work_before_its_lock_expires(
    store: tuple[str, Server], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """No renewal while the server is stopped: the run stops its work by the renew deadline
    (ttl 9s, renew 1s: 6s after the last renewal), before anyone could take the lock."""
    kind, server = store
    lock = lock_name(request)
    timing = Timing.of(9.0, 1.0, 1.0)
    started, stopped = tmp_path / "started", tmp_path / "stopped"
    work = (
        f'trap "echo stopped > {stopped}; exit 143" TERM; echo up > {started}; '
        "while :; do sleep 0.05; done"
    )
    holder = start_run(
        server.url, lock, ["sh", "-c", work], "--ttl", "9s", "--renew", "1s", "--skew", "1s"
    )
    wait_for_line(started)
    with transport(kind, server.url) as client:
        # A renewal the store has stored, not a guess that one went through by now.
        wait_for(
            lambda: renewed_since_acquired(client, LeaseRef(*lock.split("/"))),
            10,
            "a renewal stored",
        )
    paused = time.monotonic()
    server.pause()
    try:
        wait_for_line(stopped)
        stopped_after = time.monotonic() - paused
        holder.communicate(timeout=20)
    finally:
        server.resume()
    assert holder.returncode == 70
    # The last renewal stored was at most one renew period before the pause: the holder
    # gives up at its renew deadline after it (at least deadline - renew after the pause,
    # less one more renew for a renewal whose answer it never read), and a contender with
    # the same skew may take the lock ttl + skew - renew after the pause at the earliest.
    Bound(
        timing.renew_deadline - 3 * timing.renew,
        timing.ttl + timing.skew - timing.renew,
        "the pause",
        "the holder stops at its renew deadline, before a contender may take the lock",
    ).check(stopped_after)
    # Once the lock has expired on the store's clock (ttl + skew), a waiting run takes it.
    after = start_run(
        server.url, lock, ["true"], "--ttl", "9s", "--policy", "wait", "--wait-timeout", "30s"
    )
    _, err = after.communicate(timeout=45)
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
                "DELETE FROM cronlock.locks WHERE namespace = %s AND name = %s",
                (lease.namespace, lease.name),
            ).rowcount
            assert deleted == 1


def test_writes_are_compare_and_set_and_tokens_only_grow(
    store: tuple[str, Server], request: pytest.FixtureRequest
) -> None:
    kind, server = store
    lease = LeaseRef(*lock_name(request).split("/"))
    timing = Timing.of(1.0, None, 0.0)  # a 1s hold: the store lets it be taken 1s after
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
        # A live hold of another holder is the store's to refuse, whatever b judged.
        with pytest.raises(Forbidden, match="cronlock holder policy: the lock is held by a"):
            client.replace(lease, claimed(client.get(lease), "b", timing, datetime.now(UTC), ""))
        began = time.monotonic()
        taken = wait_for(
            lambda: take_over(client, lease, "b", timing), 10, "a expired on the store's clock"
        )
        # Taken once the 1s hold has expired, as soon as the machine lets the poll see it.
        assert time.monotonic() - began < timing.ttl + SLACK
        token_before = read_lease(taken).transitions
        assert token_before == read_lease(first).transitions + 1
        delete_by_hand(kind, server.url, lease)
        with pytest.raises(NotFound):
            client.replace(lease, renewed(taken, timing, datetime.now(UTC)))
        again = client.create(lease, claimed(body, "c", timing, datetime.now(UTC), ""))
        assert read_lease(again).transitions > token_before


def test_a_lock_never_taken_can_hold_a_freeze_alone(
    store: tuple[str, Server], request: pytest.FixtureRequest
) -> None:
    """`cronlock freeze --store-secret` on a lock never taken: no holder, no duration."""
    kind, server = store
    lease = LeaseRef(*lock_name(request).split("/"))
    notes = {"cronlock.io/frozen-until": "2099-01-01T00:00:00.000000Z"}
    with transport(kind, server.url) as client:
        body = {"metadata": {"name": lease.name, "annotations": notes}, "spec": {}}
        client.create(lease, body)
        read = read_lease(client.get(lease))
    assert (read.holder, read.duration_seconds) == ("", None)
    assert read.frozen_until is not None


def renewed_since_acquired(client: RedisLeaseStore | PostgresLeaseStore, lease: LeaseRef) -> bool:
    """Whether the stored hold of `lease` has been renewed since it was taken."""
    record = read_lease(client.get(lease))
    return bool(
        record.renew_time and record.acquire_time and record.renew_time > record.acquire_time
    )


def take_over(
    client: RedisLeaseStore | PostgresLeaseStore, lease: LeaseRef, who: str, timing: Timing
) -> dict[str, Any] | None:
    """`who` claims the lock as it reads now; None while the store refuses (held)."""
    try:
        return client.replace(lease, claimed(client.get(lease), who, timing, datetime.now(UTC), ""))
    except Forbidden:
        return None


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
        assert waited < 1.0 + SLACK, waited  # the call's own deadline, on a busy machine
        with pytest.raises(NotFound):
            client.get(lease)  # connects again


# --- a tamperer with the URL, writing as an attacker would (redis-py, psycopg) ------------
DAY = 86400


def tampered_document(lease: LeaseRef, holder: str, duration: int, **spec: Any) -> str:
    moment = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return json.dumps(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": lease.name, "namespace": lease.namespace},
            "spec": {
                "holderIdentity": holder,
                "acquireTime": moment,
                "renewTime": moment,
                "leaseDurationSeconds": duration,
                "leaseTransitions": 0,
                **spec,
            },
        }
    )


def write_by_hand(kind: str, url: str, lease: LeaseRef, document: str, *, at: str = "") -> None:
    """The review's write: the whole lock by HSET (Redis) or INSERT (PostgreSQL), no script;
    `at` (Redis: µs) is the write and renewal time, else the store's now."""
    if kind == "redis":
        with redis.Redis.from_url(url, decode_responses=True) as client:
            seconds, micro = client.time()
            now = at or str(seconds * 1_000_000 + micro)
            key = keys(lease)[0]
            client.hset(key, mapping={"doc": document, "version": "1000000", "fence": "0"})
            # Schema 1's fields: no `renewed`, which reads as `written`.
            client.hset(key, mapping={"writer": now, "written": now})
            client.persist(key)
    else:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(
                "INSERT INTO cronlock.locks (namespace, name, holder, transitions,"
                " resource_version, document, writer_time, written_at)"
                " VALUES (%s, %s, 'mallory', 0, 1000000, %s::jsonb, now(), now())",
                (lease.namespace, lease.name, document),
            )


def test_a_day_long_hold_written_by_hand_is_believed_only_for_the_runs_ttl(
    store: tuple[str, Server], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Anyone with the URL writes a day-long hold, bypassing cronlock; a run with ttl 2s and
    skew 1s takes the lock 3s after that write (the store agrees: the shorter of the two
    durations has passed on its clock), not after a day."""
    kind, server = store
    lock = lock_name(request)
    lease = LeaseRef(*lock.split("/"))
    with transport(kind, server.url) as client, pytest.raises(NotFound):
        client.get(lease)  # connected: PostgreSQL's schema is in place
    write_by_hand(kind, server.url, lease, tampered_document(lease, "mallory", DAY))
    written = time.monotonic()
    started = tmp_path / "started"
    run = start_run(
        server.url,
        lock,
        ["sh", "-c", f"echo up > {started}"],
        *("--ttl", "2s", "--skew", "1s", "--policy", "wait", "--wait-timeout", "30s"),
    )
    _, err = run.communicate(timeout=40)
    took = time.monotonic() - written
    assert run.returncode == 0, err
    assert started.read_text().strip() == "up"
    assert "expired" in err
    assert 2.9 <= took < 15, took


def test_a_renewal_dated_in_the_future_by_hand_keeps_nothing_alive(
    store: tuple[str, Server], request: pytest.FixtureRequest
) -> None:
    """Redis: a hash whose write and renewal are a year ahead of the store's clock (HSET
    works around any script) reads as expired and is taken at once. PostgreSQL: the
    trigger dates every write itself, whatever an UPDATE sets."""
    kind, server = store
    lease = LeaseRef(*lock_name(request).split("/"))
    timing = Timing.of(30.0, None, 1.0)
    with transport(kind, server.url) as client:
        with pytest.raises(NotFound):
            client.get(lease)
        if kind == "redis":
            ahead = str(int((time.time() + 365 * DAY) * 1_000_000))
            document = tampered_document(lease, "mallory", DAY)
            write_by_hand(kind, server.url, lease, document, at=ahead)
        else:
            write_by_hand(kind, server.url, lease, tampered_document(lease, "mallory", 30))
            with psycopg.connect(server.url, autocommit=True) as connection:
                connection.execute(
                    "UPDATE cronlock.locks SET written_at = '2099-01-01', renewed_at = '2099-01-01'"
                    " WHERE namespace = %s AND name = %s",
                    (lease.namespace, lease.name),
                )
                row = connection.execute(
                    "SELECT written_at <= clock_timestamp(), renewed_at <= clock_timestamp()"
                    " FROM cronlock.locks WHERE namespace = %s AND name = %s",
                    (lease.namespace, lease.name),
                ).fetchone()
            assert row == (True, True)
            assert take_over(client, lease, "b", timing) is None  # mallory's 30s, renewed now
            return
        taken = take_over(client, lease, "b", timing)
        assert taken is not None
        assert read_lease(client.get(lease)).holder == "b"


def test_the_store_refuses_a_tamperers_token_duration_and_takeover(
    store: tuple[str, Server], request: pytest.FixtureRequest
) -> None:
    """Through the lock's own function (Redis: FCALL, as any user of the URL can call it) or a
    raw statement (PostgreSQL: the trigger runs for every UPDATE): a lower token, a duration
    of 2147483647 and a takeover of a's live hold fail or change nothing."""
    kind, server = store
    lease = LeaseRef(*lock_name(request).split("/"))
    timing = Timing.of(30.0, None, 1.0)
    body: dict[str, Any] = {"metadata": {"name": lease.name, "namespace": lease.namespace}}
    with transport(kind, server.url) as client:
        client.create(lease, claimed(body, "a", timing, datetime.now(UTC), ""))
        held = client.get(lease)
        token = read_lease(held).transitions
        attempts = {
            "a lower token": tampered_document(lease, "a", 30, leaseTransitions=-5),
            "a duration of 2147483647": tampered_document(lease, "a", 2147483647),
            "a takeover of a live hold": tampered_document(lease, "mallory", 30),
            "a one-second takeover": tampered_document(lease, "mallory", 1),
        }
        answers = {what: tamper(kind, server.url, lease, doc) for what, doc in attempts.items()}
        after = client.get(lease)
    assert answers["a lower token"] == "written"  # a's own document: a renewal, nothing more
    assert answers["a duration of 2147483647"].startswith("refused: cronlock store:")
    assert "held by a" in answers["a takeover of a live hold"]
    assert "held by a" in answers["a one-second takeover"]
    assert read_lease(after).holder == "a"
    assert read_lease(after).transitions == token
    assert read_lease(after).duration_seconds == 30


def tamper(kind: str, url: str, lease: LeaseRef, document: str) -> str:
    """One raw write of `document` over the lock: "written", or why it was refused."""
    if kind == "redis":
        with redis.Redis.from_url(url, decode_responses=True) as raw:
            version = raw.hget(keys(lease)[0], "version")
            now = str(int(time.time() * 1_000_000))
            try:
                answer = raw.fcall(
                    redisstore.FUNCTIONS["replace"], 4, *keys(lease), document, now, "0",
                    "60000", version,
                )  # fmt: skip
            except redis.ResponseError as error:
                return f"refused: {error}"
            if answer[0] == "held":
                return f"refused: held by {answer[2]}"
            return "written" if answer[0] == "ok" else f"refused: {answer}"
    with psycopg.connect(url, autocommit=True) as connection:
        try:
            connection.execute(
                "UPDATE cronlock.locks SET document = %s::jsonb, transitions = -5"
                " WHERE namespace = %s AND name = %s",
                (document, lease.namespace, lease.name),
            )
        except psycopg.Error as error:
            return f"refused: {error}"
        return "written"


SCHEMA_1 = """
CREATE TABLE cronlock_locks (
    namespace text NOT NULL, name text NOT NULL, holder text NOT NULL DEFAULT '',
    transitions bigint NOT NULL, resource_version bigint NOT NULL, document jsonb NOT NULL,
    writer_time timestamptz NOT NULL, written_at timestamptz NOT NULL,
    PRIMARY KEY (namespace, name));
CREATE TABLE cronlock_fences (namespace text NOT NULL, name text NOT NULL,
    value bigint NOT NULL, PRIMARY KEY (namespace, name));
CREATE SEQUENCE cronlock_versions;
COMMENT ON TABLE cronlock_locks IS 'cronlock locks, schema 1 (docs/STORES.md)';
"""


def database_of_its_own(server: PostgresServer, request: pytest.FixtureRequest) -> str:
    """A new database owned by the tests' `cronlock` role (which may then create the
    schema `cronlock` in it, as a single-credential set-up's role does); its URL."""
    name = f"db_{os.getpid()}_{request.node.name[-12:].lower()}"
    with server.superuser() as connection:
        connection.execute(f"CREATE DATABASE {name} OWNER cronlock")
    return server.url.rsplit("/", 1)[0] + f"/{name}"


def test_schema_1_tables_are_moved_into_the_schema_with_their_locks(
    postgres_store: PostgresServer, request: pytest.FixtureRequest
) -> None:
    """Tables and a held row as the first version wrote them (in a schema of their own on
    the URL's search path): the first sidecar call moves them into `cronlock`, the row's
    hold, token and times carry over, and running the schema again changes nothing."""
    url = database_of_its_own(postgres_store, request)
    lease = LeaseRef("tests", "migrated")
    old_document = tampered_document(lease, "a", 1)
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("CREATE SCHEMA s1")
        connection.execute("SET search_path = s1")
        connection.execute(SCHEMA_1)
        connection.execute("INSERT INTO cronlock_fences VALUES ('tests', 'migrated', 7)")
        connection.execute(
            "INSERT INTO cronlock_locks VALUES ('tests', 'migrated', 'a', 7,"
            " nextval('cronlock_versions'), %s::jsonb, now(), now())",
            (old_document,),
        )
    # Not on the URL's search path: refused, rather than new tables whose tokens start at 1.
    with (
        transport("postgres", url) as client,
        pytest.raises(Unavailable, match="earlier schema are in the schema s1, not on this"),
    ):
        client.get(lease)
    url = f"{url}?options=-csearch_path%3Ds1"
    timing = Timing.of(1.0, None, 0.0)
    with transport("postgres", url) as client:
        read = read_lease(client.get(lease))
        assert (read.holder, read.transitions) == ("a", 7)
        taken = wait_for(lambda: take_over(client, lease, "b", timing), 10, "a's 1s to pass")
        assert read_lease(taken).transitions == 8
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(pgstore.SCHEMA)  # again: idempotent
        row = connection.execute(
            "SELECT holder, transitions, duration, obj_description('cronlock.locks'::regclass),"
            " (SELECT relkind FROM pg_class WHERE oid = 's1.cronlock_locks'::regclass)"
            " FROM cronlock.locks"
        ).fetchone()
    assert row is not None
    assert row[:3] == ("b", 8, 1)
    assert str(row[3]).startswith("cronlock locks, schema 3")
    assert row[4] == "v"  # a view where the tables were


SCHEMA_2 = (Path(__file__).parent / "pg_schema_2.sql").read_text()


def test_schema_2_in_public_is_moved_with_its_holds_and_tokens_never_go_back(
    postgres_store: PostgresServer, request: pytest.FixtureRequest
) -> None:
    """Schema 2 as the previous version made it in `public`, with a live hold and the fence
    of a lock deleted by hand: after the move the hold is still refused to another holder,
    each token goes on from where it was, and a sidecar of schema 2 then fails where it
    would have made new tables beside the moved ones."""
    url = database_of_its_own(postgres_store, request)
    held, deleted = LeaseRef("tests", "held"), LeaseRef("tests", "deleted")
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(SCHEMA_2)
        connection.execute("INSERT INTO cronlock_fences VALUES ('tests', 'deleted', 12)")
        connection.execute(
            "INSERT INTO cronlock_locks (namespace, name, transitions, resource_version,"
            " document, writer_time, written_at) VALUES ('tests', 'held', 0, 0, %s::jsonb,"
            " now(), now())",
            (tampered_document(held, "a", 30),),
        )
        connection.execute(
            "UPDATE cronlock_fences SET value = 7 WHERE namespace = 'tests' AND name = 'held'"
        )
    timing = Timing.of(30.0, None, 1.0)
    body: dict[str, Any] = {"metadata": {}}
    with transport("postgres", url) as client:
        assert read_lease(client.get(held)).holder == "a"
        assert take_over(client, held, "b", timing) is None  # a's 30 s, not over
        token = read_lease(client.get(held)).transitions
        assert token == 1  # the token written in schema 2, carried over
        created = client.create(deleted, claimed(body, "c", timing, datetime.now(UTC), ""))
        assert read_lease(created).transitions == 13  # past the moved fence's 12
    with psycopg.connect(url, autocommit=True) as connection:
        kinds = dict(
            connection.execute(
                "SELECT c.relname, c.relkind FROM pg_class c"
                " WHERE c.relnamespace = 'public'::regnamespace AND c.relname LIKE 'cronlock%'"
            ).fetchall()
        )
        assert kinds == {"cronlock_locks": "v"}
        # A sidecar of schema 2 connecting: its role's "$user" schema (here `cronlock`, the
        # tests' role's name) first, then public alone.
        for path in ('"$user", public', "public"):
            connection.execute("SELECT set_config('search_path', %s, false)", (path,))
            with (
                pytest.raises(psycopg.errors.WrongObjectType, match="cronlock_locks"),
                connection.transaction(),
            ):
                connection.execute(SCHEMA_2)
            left = connection.execute(
                "SELECT to_regclass('public.cronlock_fences'),"
                " to_regclass('cronlock.cronlock_fences')"
            ).fetchone()
            assert left == (None, None)  # rolled back: no tables beside the moved ones


# --- docs/STORES.md's blocks, run as written (PostgreSQL's roles: test_postgres_tenants.py) --
def test_the_documented_schema_is_the_one_the_sidecar_runs() -> None:
    assert documented("postgres-schema") == pgstore.SCHEMA.strip()


def test_a_redis_acl_user_per_namespace_holds_its_own_locks_only(
    redis_store: RedisServer,
) -> None:
    users = {}
    with redis.Redis.from_url(redis_store.url) as admin:
        admin.function_load(redisstore.LIBRARY, replace=True)  # test_redis_tenants: as documented
        for namespace in ("team-a", "team-b"):
            password = os.urandom(8).hex()
            line = documented("redis-acl").replace("team-a", namespace)
            admin.execute_command(*shlex.split(line.replace(">PASSWORD", f">{password}")))
            users[namespace] = (
                f"redis://cronlock-{namespace}:{password}@127.0.0.1:{redis_store.port}/0"
            )
    timing = Timing.of(30.0, None, 1.0)
    own, other = LeaseRef("team-a", "acl-report"), LeaseRef("team-b", "acl-report")
    body: dict[str, Any] = {"metadata": {}}
    with transport("redis", users["team-b"]) as team_b:
        team_b.create(other, claimed(body, "b", timing, datetime.now(UTC), ""))
    with transport("redis", users["team-a"]) as team_a:
        taken = team_a.create(own, claimed(body, "a", timing, datetime.now(UTC), ""))
        team_a.replace(own, renewed(team_a.get(own), timing, datetime.now(UTC)))
        assert read_lease(team_a.get(own)).holder == "a"
        for attempt in (
            lambda: team_a.get(other),
            lambda: team_a.create(other, claimed(body, "a", timing, datetime.now(UTC), "")),
        ):
            with pytest.raises(Forbidden, match="no permissions to access one of the keys"):
                attempt()
    with (
        redis.Redis.from_url(users["team-a"]) as raw,
        pytest.raises(redis.exceptions.NoPermissionError),
    ):
        raw.hset(keys(other)[0], "doc", "{}")
    with transport("redis", users["team-b"]) as team_b:
        assert read_lease(team_b.get(other)).holder == "b"
    assert read_lease(taken).transitions >= 1
