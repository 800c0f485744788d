"""The one door to the lock's transports: the Lease on the API server, or the store a URL
names (client-go's `resourcelock.New`: the lock's kind in, its transport out).

Each client lives in its own module (`transport.kubeapi` for the Lease, `redisstore` with
redis-py, `pgstore` with psycopg), and this module imports it only when its kind is chosen:
the sidecar's image has neither store package, and a sidecar on the Lease never imports
either. The sidecar (cli.py, `open_transport`) and the operator's `cronlock status
--read-stores` and `freeze --store-secret` (cronlock_operator.storeaccess, which checks a
URL it did not write first, `open_store`) open their lock's transport here.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
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


def open_transport(
    store: StoreUrl | None,
    environment: Mapping[str, str],
    now: Callable[[], datetime],
    timeout: float,
) -> StoreClient:
    """The lock's transport, not yet connected: `store`'s client, or without a store the
    Lease through the API server that `environment` names (kubectl's order,
    `transport.kubeconfig.load_cluster`). `now` and `timeout` as for `open_store`; the
    Lease's client judges no times, the API server keeps them.
    KubeConfigError when no API server can be read from `environment`; ImportError when a
    store's package is not installed."""
    if store is not None:
        return open_store(store, now, timeout)
    from cronlock_sidecar.transport.kubeapi import KubeLeaseClient
    from cronlock_sidecar.transport.kubeconfig import load_cluster

    return KubeLeaseClient(load_cluster(environment), timeout=timeout)
