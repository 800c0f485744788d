"""The holders of locks kept in Redis or PostgreSQL (`cronlock.io/store`), for `cronlock status`.

Read only when asked (`--read-stores`): the Secret and the host are the CronJob author's
choice, the credentials and the network the caller's (storeaccess.py). Where the user's
credentials may read the Secret the CronJob names, its URL reaches the store and the lock's
document is read there (the sidecar's own transport, read-only: PostgreSQL's tables are
never created from here), so the row shows the holder like a Lease's; which host:port is
read for which Secret is said before connecting. Where they may not, or the store's client
is not installed (`pip install 'cronlock[redis]'`), the row stays `in-store` and one note
says why.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cronlock_operator.storeaccess import StoreAccessError, address, open_store, store_url
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


def read_stores(api: Any, locks: Iterable[StoredLock], say: Callable[[str], None]) -> StoreReading:
    """Each lock's document from its store; a lock never taken there is a free one ({}).
    `say` gets, before each connection, which host:port is read for which Secret."""
    reading = StoreReading({}, [])
    for lock in sorted(set(locks), key=lambda each: (each.namespace, each.lease)):
        where = f"{lock.namespace}/{lock.lease} ({lock.kind})"
        try:
            url = store_url(api, lock.namespace, lock.secret, lock.kind)
            store = open_store(url, read_only=True)
            say(
                f"reading {where} from {lock.kind} at {address(url)} "
                f"(Secret {lock.namespace}/{lock.secret})"
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
