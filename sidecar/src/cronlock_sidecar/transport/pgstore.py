"""The lock in PostgreSQL: a row per lock in `cronlock_locks`, written by conditional statements.

A create is an INSERT that does nothing where a row exists; a renew, a takeover and a
release are UPDATEs of the version the writer read (`resource_version`), so each is the
one its reader judged and a stale holder's write matches no row. `transitions` is the
fencing token; `cronlock_fences` keeps, per lock, the highest token ever handed out, so a
row deleted by hand is created again with a higher one. Ages are judged on the
database's clock alone (`clock_timestamp()`, `transport.frames`). The tables are created
where missing (docs/STORES.md has the DDL, for a role that may not create them).

Every call has a deadline, also when the server stopped answering but its kernel still
holds the connection open (a paused server): a timer shuts the socket down, the call fails
as Unavailable, and the next call connects again.

psycopg is imported here only, and only when a CronJob or `run --store` chooses PostgreSQL.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
from psycopg import errors

from cronlock_sidecar.transport.documents import stamped, token_of, unversioned, version_read
from cronlock_sidecar.transport.frames import to_reader
from cronlock_sidecar.transport.seam import (
    ApiError,
    Conflict,
    Forbidden,
    Lease,
    LeaseRef,
    NotFound,
    Unavailable,
)
from cronlock_sidecar.transport.storeurl import StoreUrl

SCHEMA = """
CREATE TABLE IF NOT EXISTS cronlock_locks (
    namespace        text        NOT NULL,
    name             text        NOT NULL,
    holder           text        NOT NULL DEFAULT '',
    transitions      bigint      NOT NULL,
    resource_version bigint      NOT NULL,
    document         jsonb       NOT NULL,
    writer_time      timestamptz NOT NULL,
    written_at       timestamptz NOT NULL,
    PRIMARY KEY (namespace, name)
);
CREATE TABLE IF NOT EXISTS cronlock_fences (
    namespace text   NOT NULL,
    name      text   NOT NULL,
    value     bigint NOT NULL,
    PRIMARY KEY (namespace, name)
);
CREATE SEQUENCE IF NOT EXISTS cronlock_versions;
COMMENT ON TABLE cronlock_locks IS 'cronlock locks, schema 1 (docs/STORES.md)';
"""
_SCHEMA_PRESENT = """
SELECT to_regclass('cronlock_locks') IS NOT NULL
   AND to_regclass('cronlock_fences') IS NOT NULL
   AND to_regclass('cronlock_versions') IS NOT NULL
"""
_GET = """
SELECT document, resource_version, transitions, writer_time, written_at, clock_timestamp()
  FROM cronlock_locks WHERE namespace = %(namespace)s AND name = %(name)s
"""
# The fence row moves first (it only grows); the lock row is written only where none is.
_CREATE = """
WITH fence AS (
    INSERT INTO cronlock_fences AS f (namespace, name, value)
    VALUES (%(namespace)s, %(name)s, %(token)s)
    ON CONFLICT (namespace, name) DO UPDATE SET value = GREATEST(f.value + 1, EXCLUDED.value)
    RETURNING value
)
INSERT INTO cronlock_locks AS l
    (namespace, name, holder, transitions, resource_version, document, writer_time, written_at)
SELECT %(namespace)s, %(name)s, %(holder)s, fence.value, nextval('cronlock_versions'),
       %(document)s::jsonb, %(writer_time)s, clock_timestamp()
  FROM fence
ON CONFLICT (namespace, name) DO NOTHING
RETURNING transitions, resource_version
"""
_REPLACE = """
WITH fence AS (
    INSERT INTO cronlock_fences AS f (namespace, name, value)
    VALUES (%(namespace)s, %(name)s, %(token)s)
    ON CONFLICT (namespace, name) DO UPDATE SET value = GREATEST(f.value, EXCLUDED.value)
    RETURNING value
)
UPDATE cronlock_locks AS l
   SET holder = %(holder)s, transitions = %(token)s,
       resource_version = nextval('cronlock_versions'), document = %(document)s::jsonb,
       writer_time = %(writer_time)s, written_at = clock_timestamp()
  FROM fence
 WHERE l.namespace = %(namespace)s AND l.name = %(name)s
   AND l.resource_version = %(version)s
RETURNING l.transitions, l.resource_version
"""
_EXISTS = "SELECT 1 FROM cronlock_locks WHERE namespace = %(namespace)s AND name = %(name)s"
# SQLSTATE classes that mean "you may not": 28 (authorization), 42501 (privilege).
_REFUSED = ("28", "42501")


class PostgresLeaseStore:
    """LeaseTransport on PostgreSQL; `now` is the sidecar's wall clock (what it writes on)."""

    def __init__(
        self,
        url: StoreUrl,
        now: Callable[[], datetime],
        timeout: float = 5.0,
        *,
        create_tables: bool = True,
    ) -> None:
        """`create_tables=False`: a reader (`cronlock status`) that never creates them."""
        self.url = url
        self.now = now
        self.timeout = timeout
        self.create_tables = create_tables
        self._connection: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    def get(self, lease: LeaseRef, *, timeout: float | None = None) -> Lease:
        row = self._one("get", lease, _GET, _keys(lease), timeout)
        reader_now = self.now()
        if row is None:
            raise NotFound("get", lease, f"no lock in {self.url}")
        document, version, token, writer_time, written_at, store_now = row
        body = to_reader(
            document,
            writer_time=writer_time,
            written_at=written_at,
            store_now=store_now,
            reader_now=reader_now,
        )
        return stamped(body, version, token)

    def create(self, lease: LeaseRef, body: Lease, *, timeout: float | None = None) -> Lease:
        document, parameters = self._parameters(lease, body)
        row = self._one("create", lease, _CREATE, parameters, timeout)
        if row is None:
            raise Conflict("create", lease, "created by someone else meanwhile")
        token, version = row
        return stamped(document, version, token)

    def replace(self, lease: LeaseRef, body: Lease, *, timeout: float | None = None) -> Lease:
        version = version_read(body)
        if not version.isdigit():
            raise Conflict("update", lease, "no version read to compare with")
        document, parameters = self._parameters(lease, body)
        parameters["version"] = int(version)
        row = self._one("update", lease, _REPLACE, parameters, timeout)
        if row is None:
            if self._one("update", lease, _EXISTS, _keys(lease), timeout) is None:
                raise NotFound("update", lease, f"no lock in {self.url}")
            raise Conflict("update", lease, "written by someone else since it was read")
        token, version = row
        return stamped(document, version, token)

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def __enter__(self) -> PostgresLeaseStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # --- statements -----------------------------------------------------------------
    def _parameters(self, lease: LeaseRef, body: Lease) -> tuple[dict[str, Any], dict[str, Any]]:
        document = unversioned(body)
        parameters = {
            **_keys(lease),
            "holder": str((body.get("spec") or {}).get("holderIdentity") or ""),
            "token": token_of(body),
            "document": json.dumps(document, separators=(",", ":")),
            "writer_time": self.now(),
        }
        return document, parameters

    def _one(
        self,
        verb: str,
        lease: LeaseRef,
        statement: str,
        parameters: dict[str, Any],
        timeout: float | None,
    ) -> tuple[Any, ...] | None:
        seconds = self.timeout if timeout is None else max(0.1, min(timeout, self.timeout))
        with self._lock:
            try:
                connection = self._connect(verb, lease, seconds)
                with _deadline(connection, seconds), connection.cursor() as cursor:
                    cursor.execute(statement, parameters)
                    return cursor.fetchone()
            except psycopg.Error as error:
                self._drop()
                raise _translated(verb, lease, self.url, error) from None

    def _connect(self, verb: str, lease: LeaseRef, seconds: float) -> psycopg.Connection[Any]:
        if self._connection is not None and not self._connection.closed:
            return self._connection
        try:
            connection = psycopg.connect(
                self.url.secret,
                autocommit=True,
                connect_timeout=max(2, round(seconds)),
                application_name="cronlock-sidecar",
            )
        except psycopg.Error as error:
            raise _translated(verb, lease, self.url, error) from None
        try:
            with _deadline(connection, seconds):
                if self.create_tables:
                    _ensure_schema(connection)
        except psycopg.Error as error:
            connection.close()
            raise _translated(verb, lease, self.url, error, schema=True) from None
        self._connection = connection
        return connection

    def _drop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _ensure_schema(connection: psycopg.Connection[Any]) -> None:
    """Create the tables where missing, once across all the contenders (an advisory lock)."""
    row = connection.execute(_SCHEMA_PRESENT).fetchone()
    if row is not None and row[0]:
        return
    with connection.transaction():
        connection.execute("SELECT pg_advisory_xact_lock(hashtext('cronlock_locks'))")
        connection.execute(SCHEMA)


@contextmanager
def _deadline(connection: psycopg.Connection[Any], seconds: float) -> Iterator[None]:
    """Shut the connection's socket down if the call is still waiting after `seconds`."""
    timer = threading.Timer(seconds, _cut, args=(connection,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _cut(connection: psycopg.Connection[Any]) -> None:
    try:
        duplicate = socket.socket(fileno=socket.dup(connection.fileno()))
    except (OSError, psycopg.Error):
        return
    try:
        duplicate.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        duplicate.close()


def _translated(
    verb: str, lease: LeaseRef, url: StoreUrl, error: psycopg.Error, *, schema: bool = False
) -> ApiError:
    state = error.sqlstate or ""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    refused = state.startswith(_REFUSED) or isinstance(error, errors.InsufficientPrivilege)
    if not state and "password authentication failed" in text:
        refused = True
    if refused:
        hint = " (create the tables as docs/STORES.md shows, or grant CREATE)" if schema else ""
        return Forbidden(verb, lease, f"{url}: {text}{hint}")
    if isinstance(error, errors.UndefinedTable):
        # Only a reader that does not create them meets this: no lock was ever taken here.
        return NotFound(verb, lease, f"{url}: {text}")
    return Unavailable(verb, lease, f"{url}: {text}")


def _keys(lease: LeaseRef) -> dict[str, Any]:
    return {"namespace": lease.namespace, "name": lease.name}
