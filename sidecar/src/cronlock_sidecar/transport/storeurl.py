"""A lock store's URL: which store it names, checked up front, and never shown with its secret."""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import SplitResult, urlsplit

# scheme -> the store it names (redis-py and libpq accept these)
SCHEMES = {
    "redis": "redis",
    "rediss": "redis",
    "postgres": "postgres",
    "postgresql": "postgres",
}
FORMS = "redis://[:PASSWORD@]HOST[:PORT][/DB], rediss://… (TLS) or postgresql://USER:PASSWORD@HOST[:PORT]/DB"


class StoreUrlError(ValueError):
    """A URL that names no store we speak; the message never contains the URL's password."""


class StoreUrl(NamedTuple):
    """The URL as given (`secret`, for the client only) and what may be shown of it."""

    kind: str  # "redis" or "postgres"
    secret: str
    shown: str

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
    return StoreUrl(kind, url, shown)
