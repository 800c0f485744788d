"""A Lease document as a store keeps it (no version of its own) and gives it back (the store's)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from cronlock_sidecar.contract import HOLDER_POLICY_DENIAL
from cronlock_sidecar.lock.model import read_lease, with_token

# How every store refusal of a write that breaks the lock's rules begins (a bad duration,
# a document that is not one); a refused change of holder reads as the holders' policy's.
STORE_REFUSAL = "cronlock store:"
# How far ahead of the store's own clock a claim's tick record may be (docs/STORES.md, "Tick
# records in a store"): a tick further ahead is refused outright, and a recorded one further
# ahead is nobody's (a claim may replace it). Both stores keep the same bound.
TICK_AHEAD_SECONDS = 60


def unversioned(body: dict[str, Any]) -> dict[str, Any]:
    """What a store keeps of a Lease written to it: all but the version it was read at."""
    metadata = {
        key: value
        for key, value in (body.get("metadata") or {}).items()
        if key != "resourceVersion"
    }
    return {**body, "metadata": metadata}


def renewal_age(body: dict[str, Any], writer_time: datetime) -> timedelta:
    """How long before `writer_time` the document's renewTime is (never negative): the store
    dates the write's renewal that much before its own clock's now, never after it."""
    renewed = read_lease(body).renew_time
    if renewed is None or renewed > writer_time:
        return timedelta(0)
    return writer_time - renewed


def held_refusal(holder: str, since_micros: int, duration_seconds: int) -> str:
    """The store's refusal of a change of holder, worded as the holders' policy's."""
    return (
        f"{HOLDER_POLICY_DENIAL} the lock is held by {holder}, renewed "
        f"{since_micros / 1_000_000:.3f}s ago on the store's clock for {duration_seconds}s; "
        "until it expires only its holder (or a later pod of its Job) may change it"
    )


def version_read(body: dict[str, Any]) -> str:
    """The store's version the writer read this Lease at ("" when it read none)."""
    return str((body.get("metadata") or {}).get("resourceVersion") or "")


def stamped(document: dict[str, Any], version: int | str, token: int | str) -> dict[str, Any]:
    """The document as a reader sees it: the store's version and fencing token in place."""
    metadata = {**(document.get("metadata") or {}), "resourceVersion": str(version)}
    return with_token({**document, "metadata": metadata}, int(token))
