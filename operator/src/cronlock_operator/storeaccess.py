"""Reach a lock kept in Redis or PostgreSQL with the caller's credentials: the URL from the
Secret a CronJob names (`cronlock.io/store-secret`, key `url`), and the sidecar's own
client for that store. Used by `cronlock status --read-stores` (to read holders) and
`cronlock freeze --store-secret` (to write a freeze on the stored lock); the operator
itself never reads Secrets.

Whoever wrote the Secret chose the host, and the caller is often an admin: nothing of the
caller's machine goes with the connection but what the URL says (security review L4).
PostgreSQL connects isolated (stores/pgstore.py: no PG* environment, password file,
client certificate or Kerberos ticket), only over TCP and as the URL's user; a Redis URL
may ask only for query parameters that read nothing of the caller's (redis-py passes any
other on, `ssl_certfile=` too, and reads no environment itself).
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

import kubernetes

from cronlock_operator.kube.answers import answered
from cronlock_operator.kube.errors import APIError, Forbidden, NotFound
from cronlock_sidecar import contract
from cronlock_sidecar.stores import open as door
from cronlock_sidecar.stores.url import (
    ISOLATING_LIBPQ,
    StoreUrl,
    StoreUrlError,
    parse_store_url,
)
from cronlock_sidecar.transport.seam import StoreClient

STORE_TIMEOUT_SECONDS: Final = 5.0
DEFAULT_PORTS: Final = {"redis": 6379, "postgres": 5432}
# redis-py's URL query parameters that name nothing of the caller's (a database, the
# protocol, how the server's certificate is checked and against which CAs).
REDIS_QUERY_ALLOWED: Final = frozenset(
    {"db", "protocol", "ssl_cert_reqs", "ssl_check_hostname", "ssl_ca_certs", "ssl_ca_path"}
)
# libpq parameters that would read the caller's files for the URL's host (a service file
# entry, with its password) or write one of the URL's choosing (TLS keys).
POSTGRES_REFUSED: Final = ("service", "servicefile", "sslkeylogfile")


class StoreAccessError(Exception):
    """The store cannot be reached from here: the reason, for one line."""


def store_url(api: Any, namespace: str, secret: str, kind: str | None = None) -> StoreUrl:
    """The URL in Secret `namespace/secret`, key `url`; StoreAccessError saying why not
    (no right to read it, no such Secret or key, not a store URL, another kind)."""
    core = kubernetes.client.CoreV1Api(api)
    try:
        with answered(f"reading Secret {namespace}/{secret}"):
            body = core.read_namespaced_secret(secret, namespace)
    except Forbidden:
        raise StoreAccessError(f"you may not read Secret {namespace}/{secret}") from None
    except NotFound:
        raise StoreAccessError(f"there is no Secret {namespace}/{secret}") from None
    except APIError as error:
        raise StoreAccessError(str(error)) from None
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


def address(url: StoreUrl) -> str:
    """HOST:PORT the URL reaches (a PostgreSQL URL's `?host=`/`?port=` win, as in libpq)."""
    parts = urlsplit(url.secret)
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    host = parts.hostname or ""
    try:
        port = str(parts.port or DEFAULT_PORTS[url.kind])
    except ValueError:
        port = "?"
    if url.kind == "postgres":
        host = query.get("hostaddr") or query.get("host", host)
        port = query.get("port", port)
    host = f"[{host}]" if ":" in host else host
    return f"{host or '(none)'}:{port}"


def open_store(url: StoreUrl, *, read_only: bool) -> StoreClient:
    """The sidecar's client for the store (its one door, stores/open.py), taking
    nothing of the caller's machine along (module docstring); `read_only` never creates
    PostgreSQL's tables. StoreAccessError when its package is missing or the URL asks
    for what cronlock does not lend."""
    try:
        if url.kind == "redis":
            _check_redis(url)
        else:
            _check_postgres(url)
        return door.open_store(
            url, _now, STORE_TIMEOUT_SECONDS, create_tables=not read_only, isolated=True
        )
    except ImportError:
        raise StoreAccessError(
            f"the {url.kind} client is not installed (pip install 'cronlock[{url.kind}]')"
        ) from None


def _check_redis(url: StoreUrl) -> None:
    asked = sorted(set(parse_qs(urlsplit(url.secret).query)) - REDIS_QUERY_ALLOWED)
    if asked:
        raise StoreAccessError(
            f"{url}: its query asks for {', '.join(asked)}, which cronlock does not pass on "
            f"from your machine (only {', '.join(sorted(REDIS_QUERY_ALLOWED))})"
        )


def _check_postgres(url: StoreUrl) -> None:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    if psycopg.pq.version() < ISOLATING_LIBPQ:
        raise StoreAccessError(
            f"psycopg uses libpq {psycopg.pq.version()}; reading a store from here needs "
            "libpq 16 or later, to connect without your client certificate or Kerberos "
            "ticket (pip install 'psycopg[binary]>=3.2')"
        )
    try:
        parameters = conninfo_to_dict(url.secret)
    except psycopg.Error as error:
        raise StoreAccessError(f"{url}: not a libpq URL: {error}") from None
    asked = [name for name in POSTGRES_REFUSED if name in parameters]
    if asked:
        raise StoreAccessError(
            f"{url}: it asks for {', '.join(asked)}, which would read your files for its "
            "host; cronlock does not lend them"
        )
    hosts = str(parameters.get("host") or "").split(",")
    if not parameters.get("hostaddr") and any(
        not host or host.startswith(("/", "@")) for host in hosts
    ):
        raise StoreAccessError(
            f"{url}: names no TCP host; a Unix socket here would be a server of your "
            "machine's, reached as you"
        )
    if not parameters.get("user"):
        raise StoreAccessError(f"{url}: names no user; cronlock does not lend yours")


def _now() -> datetime:
    return datetime.now(UTC)
