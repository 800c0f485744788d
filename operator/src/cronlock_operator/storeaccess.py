"""Reach a lock kept in Redis or PostgreSQL with the caller's credentials: the URL from the
Secret a CronJob names (`cronlock.io/store-secret`, key `url`), and the sidecar's own
client for that store. Used by `cronlock status` (to read holders) and `cronlock freeze`
(to write a freeze on the stored lock); the operator itself never reads Secrets.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any, Final

import kubernetes

from cronlock_sidecar import contract
from cronlock_sidecar.transport.storeurl import StoreUrl, StoreUrlError, parse_store_url

STORE_TIMEOUT_SECONDS: Final = 5.0


class StoreAccessError(Exception):
    """The store cannot be reached from here: the reason, for one line."""


def store_url(api: Any, namespace: str, secret: str, kind: str | None = None) -> StoreUrl:
    """The URL in Secret `namespace/secret`, key `url`; StoreAccessError saying why not
    (no right to read it, no such Secret or key, not a store URL, another kind)."""
    core = kubernetes.client.CoreV1Api(api)
    try:
        body = core.read_namespaced_secret(secret, namespace)
    except kubernetes.client.ApiException as error:
        reason = {403: "you may not read", 404: "there is no"}.get(error.status)
        raise StoreAccessError(
            f"{reason} Secret {namespace}/{secret}"
            if reason
            else f"reading Secret {namespace}/{secret}: HTTP {error.status}"
        ) from None
    encoded = (body.data or {}).get(contract.STORE_SECRET_URL_KEY)
    if encoded is None:
        raise StoreAccessError(
            f"Secret {namespace}/{secret} has no key {contract.STORE_SECRET_URL_KEY}"
        )
    text = base64.b64decode(encoded).decode("utf-8", "replace")
    try:
        parsed = parse_store_url(text, f"Secret {namespace}/{secret}")
    except StoreUrlError as error:
        raise StoreAccessError(str(error)) from None
    if kind is not None and parsed.kind != kind:
        raise StoreAccessError(
            f"Secret {namespace}/{secret} names a {parsed.kind} store, the CronJob {kind}"
        )
    return parsed


def open_store(url: StoreUrl, *, read_only: bool) -> Any:
    """The sidecar's client for the store (a LeaseTransport with close()); `read_only`
    never creates PostgreSQL's tables. StoreAccessError when its package is missing."""
    try:
        if url.kind == "redis":
            from cronlock_sidecar.transport.redisstore import RedisLeaseStore

            return RedisLeaseStore(url, _now, STORE_TIMEOUT_SECONDS)
        from cronlock_sidecar.transport.pgstore import PostgresLeaseStore

        return PostgresLeaseStore(url, _now, STORE_TIMEOUT_SECONDS, create_tables=not read_only)
    except ImportError:
        raise StoreAccessError(
            f"the {url.kind} client is not installed (pip install 'cronlock[{url.kind}]')"
        ) from None


def _now() -> datetime:
    return datetime.now(UTC)
