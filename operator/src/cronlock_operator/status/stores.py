"""The holders of locks kept in Redis or PostgreSQL (`cronlock.io/store`), for `cronlock status`.

Such a lock has no Lease in the cluster. Where the user's credentials may read the Secret
the CronJob names, its URL reaches the store and the lock's document is read there (the
sidecar's own transport, read-only: PostgreSQL's tables are never created from here), so
the row shows the holder like a Lease's. Where they may not, or the store's client is not
installed (`pip install 'cronlock[redis]'`), the row stays `in-store` and one note says why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cronlock_operator.storeaccess import StoreAccessError, open_store, store_url
from cronlock_sidecar.transport.seam import ApiError, LeaseRef, NotFound


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
    for lock in sorted(set(locks), key=lambda each: (each.namespace, each.lease)):
        where = f"{lock.namespace}/{lock.lease} ({lock.kind})"
        try:
            store = open_store(
                store_url(api, lock.namespace, lock.secret, lock.kind), read_only=True
            )
        except StoreAccessError as error:
            reading.notes.append(f"{where}: holder not shown: {error}")
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
