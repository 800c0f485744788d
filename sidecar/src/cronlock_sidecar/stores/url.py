"""A lock store's URL: which store it names, checked up front, and never shown with its secret."""

from __future__ import annotations

from typing import Final, NamedTuple
from urllib.parse import SplitResult, parse_qs, parse_qsl, urlencode, urlsplit, urlunsplit

# scheme -> the store it names (redis-py and libpq accept these)
SCHEMES = {
    "redis": "redis",
    "rediss": "redis",
    "postgres": "postgres",
    "postgresql": "postgres",
}
# The settings that make each client check the server it reaches (redis-py's to_bool and
# libpq's sslmode values).
VERIFYING_SSLMODES = ("verify-full", "verify-ca")
FALSE_WORDS = ("0", "f", "false", "n", "no")
DOCS = 'docs/STORES.md, "TLS to the store"'
FORMS = "redis://[:PASSWORD@]HOST[:PORT][/DB], rediss://… (TLS) or postgresql://USER:PASSWORD@HOST[:PORT]/DB"
# cronlock's own query parameter of a Redis URL (taken out before redis-py sees the URL):
# how many replicas must have each lock write before it counts (Redis' WAIT).
REPLICAS = "replicas"
MOST_REPLICAS = 16
REPLICAS_DOCS = 'docs/STORES.md, "Redis failover"'
# The libpq an `isolated` PostgreSQL connection needs (16: sslcertmode, require_auth);
# whoever opens one checks psycopg's libpq against it before connecting (pgstore.ISOLATED).
# Here, below both, so the store (pgstore) and whoever checks first (the operator's
# storeaccess) name one number without importing the door that opens the store.
ISOLATING_LIBPQ: Final = 160000


class StoreUrlError(ValueError):
    """A URL that names no store we speak; the message never contains the URL's password."""


class StoreUrl(NamedTuple):
    """The URL as given (`secret`, for the client only) and what may be shown of it."""

    kind: str  # "redis" or "postgres"
    secret: str  # without cronlock's own parameters: what the client is given
    shown: str
    replicas: int = 0  # Redis: replicas that must have a lock write before it counts

    def __repr__(self) -> str:
        return f"StoreUrl({self.kind!r}, {self.shown!r})"

    def __str__(self) -> str:
        return self.shown


def redacted(parts: SplitResult) -> str:
    """The URL without its password (and without the query, which may carry one)."""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        port = ":?"
    user = f"{parts.username}@" if parts.username else ""
    if parts.password is not None:
        user = f"{parts.username or ''}:***@"
    return f"{parts.scheme}://{user}{host}{port}{parts.path}"


def parse_store_url(text: str, name: str) -> StoreUrl:
    """The store `text` names; StoreUrlError (naming `name`, the flag or file) otherwise."""
    url = text.strip()
    if not url:
        raise StoreUrlError(f"{name}: empty; expected {FORMS}")
    if any(character in url for character in "\r\n\t "):
        raise StoreUrlError(f"{name}: contains whitespace; expected one URL, {FORMS}")
    parts = urlsplit(url)
    kind = SCHEMES.get(parts.scheme.lower())
    shown = redacted(parts)
    if kind is None:
        scheme = parts.scheme or "(none)"
        raise StoreUrlError(f"{name}: scheme {scheme!r} names no lock store; expected {FORMS}")
    if not parts.hostname and kind == "redis":
        raise StoreUrlError(f"{name}: {shown} has no host; expected {FORMS}")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when asked
    except ValueError:
        raise StoreUrlError(f"{name}: {shown} has no valid port; expected {FORMS}") from None
    replicas, secret = _replicas(url, parts, kind, name)
    return StoreUrl(kind, secret, shown, replicas)


def _replicas(url: str, parts: SplitResult, kind: str, name: str) -> tuple[int, str]:
    """`?replicas=N` taken out of a Redis URL, checked; (0, the URL) when it has none."""
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    asked = [value for key, value in pairs if key.lower() == REPLICAS]
    if not asked:
        return 0, url
    if kind != "redis":
        raise StoreUrlError(
            f"{name}: {REPLICAS}= is for a Redis URL; PostgreSQL keeps a write on a standby "
            f"by the server's synchronous replication (synchronous_commit and "
            f"synchronous_standby_names), see {REPLICAS_DOCS}"
        )
    text = asked[-1]
    if not text.isdigit() or not 0 <= int(text) <= MOST_REPLICAS:
        raise StoreUrlError(
            f"{name}: {REPLICAS}={text!r} is not a whole number from 0 to {MOST_REPLICAS} "
            f"(replicas that must have each lock write, {REPLICAS_DOCS})"
        )
    rest = urlencode([(key, value) for key, value in pairs if key.lower() != REPLICAS])
    return int(text), urlunsplit(parts._replace(query=rest))


def tls_warning(url: StoreUrl) -> str | None:
    """One line when the connection to the store is not both encrypted and checked against
    the server's certificate (what someone on the path gets, and what to set instead);
    None when it is, or when the store is on loopback or a Unix socket (no path)."""
    parts = urlsplit(url.secret)
    query = {key.lower(): values[-1] for key, values in parse_qs(parts.query).items()}
    host = query.get("host", parts.hostname or "") if url.kind == "postgres" else parts.hostname
    if _local(host or ""):
        return None
    gain = "whoever is on the network path can learn its password and rewrite every lock in it"
    if url.kind == "redis":
        if parts.scheme.lower() == "redis":
            return f"store {url}: not TLS (redis://): {gain}; use rediss:// ({DOCS})"
        if query.get("ssl_cert_reqs", "").lower() == "none" or (
            query.get("ssl_check_hostname", "").lower() in FALSE_WORDS
        ):
            return (
                f"store {url}: TLS without checking the server (ssl_cert_reqs=none or "
                f"ssl_check_hostname=false): {gain}; drop that setting, and give the "
                f"server's CA with ssl_ca_certs=PATH where it is not a public one ({DOCS})"
            )
        return None
    mode = query.get("sslmode")
    if mode is None and query.get("sslrootcert") == "system":
        return None  # libpq 16 and later: verify-full unless told otherwise
    if mode in VERIFYING_SSLMODES:
        return None
    said = f"sslmode={mode}" if mode is not None else "sslmode=prefer, libpq's default"
    return (
        f"store {url}: TLS not verified ({said}): {gain}; set sslmode=verify-full and "
        f"sslrootcert=PATH of the server's CA (or sslrootcert=system) ({DOCS})"
    )


def _local(host: str) -> bool:
    """Loopback or a Unix socket (libpq's empty host and directory paths): no network path."""
    # Imported here: options.py imports this module on every run's way to its work.
    import ipaddress

    if not host or host.startswith(("/", "@")) or host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
