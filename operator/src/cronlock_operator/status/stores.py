"""The holders of locks kept in Redis or PostgreSQL (`cronlock.io/store`), for `cronlock status`.

Such a lock has no Lease in the cluster. Where the user's credentials may read the Secret
the CronJob names, its URL reaches the store and the lock's document is read there (the
sidecar's own transport, read-only: PostgreSQL's tables are never created from here), so
the row shows the holder like a Lease's. Where they may not, or the store's client is not
installed (`pip install 'cronlock[redis]'`), the row stays `in-store` and one note says why.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import kubernetes

from cronlock_sidecar import contract
from cronlock_sidecar.transport.seam import ApiError, LeaseRef, NotFound
from cronlock_sidecar.transport.storeurl import StoreUrl, StoreUrlError, parse_store_url

STORE_TIMEOUT_SECONDS: Final = 5.0


@dataclass(frozen=True)
class StoredLock:
    """One lock a guarded CronJob keeps in a store: where, and through which Secret."""

    namespace: str
    lease: str  # the lock's key, the Lease's name
    kind: str  # redis | postgres
    secret: str


@dataclass
class StoreReading:
    """What the stores said: documents by (namespace, lease), and why some were not read."""

    documents: dict[tuple[str, str], Mapping[str, Any]]
    notes: list[str]


def read_stores(api: Any, locks: Iterable[StoredLock]) -> StoreReading:
    """Each lock's document from its store; a lock never taken there is a free one ({})."""
    reading = StoreReading({}, [])
    core = kubernetes.client.CoreV1Api(api)
    for lock in sorted(set(locks), key=lambda each: (each.namespace, each.lease)):
        where = f"{lock.namespace}/{lock.lease} ({lock.kind})"
        try:
            url = _url_of(core, lock)
        except _NotRead as missing:
            reading.notes.append(f"{where}: holder not shown: {missing}")
            continue
        try:
            store = _transport(lock.kind, url)
        except ImportError:
            reading.notes.append(
                f"{where}: holder not shown: the {lock.kind} client is not installed "
                f"(pip install 'cronlock[{lock.kind}]')"
            )
            continue
        try:
            document = store.get(LeaseRef(lock.namespace, lock.lease))
        except NotFound:
            document = {}
        except ApiError as error:
            reading.notes.append(f"{where}: holder not shown: {error}")
            continue
        finally:
            store.close()
        reading.documents[lock.namespace, lock.lease] = document
    return reading


class _NotRead(Exception):
    pass


def _url_of(core: Any, lock: StoredLock) -> StoreUrl:
    try:
        secret = core.read_namespaced_secret(lock.secret, lock.namespace)
    except kubernetes.client.ApiException as error:
        reason = {403: "you may not read", 404: "there is no"}.get(error.status)
        raise _NotRead(
            f"{reason} Secret {lock.namespace}/{lock.secret}"
            if reason
            else f"reading Secret {lock.namespace}/{lock.secret}: HTTP {error.status}"
        ) from None
    encoded = (secret.data or {}).get(contract.STORE_SECRET_URL_KEY)
    if encoded is None:
        raise _NotRead(
            f"Secret {lock.namespace}/{lock.secret} has no key {contract.STORE_SECRET_URL_KEY}"
        )
    text = base64.b64decode(encoded).decode("utf-8", "replace")
    try:
        parsed = parse_store_url(text, f"Secret {lock.namespace}/{lock.secret}")
    except StoreUrlError as error:
        raise _NotRead(str(error)) from None
    if parsed.kind != lock.kind:
        raise _NotRead(
            f"Secret {lock.namespace}/{lock.secret} names a {parsed.kind} store, "
            f"the CronJob {lock.kind}"
        )
    return parsed


def _transport(kind: str, url: StoreUrl) -> Any:
    """The sidecar's client for the store, reading only; ImportError without its package."""
    if kind == "redis":
        from cronlock_sidecar.transport.redisstore import RedisLeaseStore

        return RedisLeaseStore(url, _now, STORE_TIMEOUT_SECONDS)
    from cronlock_sidecar.transport.pgstore import PostgresLeaseStore

    return PostgresLeaseStore(url, _now, STORE_TIMEOUT_SECONDS, create_tables=False)


def _now() -> datetime:
    return datetime.now(UTC)
