"""The one door to the lock's stores beside the Lease: the client for the store a URL names.

Each store's client lives in its own module (`redisstore` with redis-py, `pgstore` with
psycopg), and this module imports it only when its store is chosen: the sidecar's image
has neither package, and a sidecar on the Lease never imports either. The sidecar's
`--store` (cli.py) and the operator's `cronlock status --read-stores` and `freeze
--store-secret` (cronlock_operator.storeaccess, which checks a URL it did not write
first) both open their store here.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import datetime

    from cronlock_sidecar.stores.url import StoreUrl
    from cronlock_sidecar.transport.seam import StoreClient


def open_store(
    url: StoreUrl,
    now: Callable[[], datetime],
    timeout: float,
    *,
    create_tables: bool = True,
    isolated: bool = False,
) -> StoreClient:
    """The client for `url`'s store, not yet connected; `now` is the clock it writes and
    judges times on, `timeout` each call's deadline in seconds. `create_tables=False`
    never creates PostgreSQL's tables nor loads Redis' function library (a reader);
    PostgreSQL only: `isolated` connects with the URL alone (pgstore.py); Redis reads
    nothing of the caller's.
    ImportError when the store's package is not installed."""
    if url.kind == "redis":
        from cronlock_sidecar.stores.redisstore import RedisLeaseStore

        return RedisLeaseStore(url, now, timeout, load_library=create_tables)
    from cronlock_sidecar.stores.pgstore import PostgresLeaseStore

    return PostgresLeaseStore(url, now, timeout, create_tables=create_tables, isolated=isolated)
