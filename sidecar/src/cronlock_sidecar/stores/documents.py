"""A Lease document as a store keeps it (no version of its own) and gives it back (the store's)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from cronlock_sidecar.contract import HOLDER_POLICY_DENIAL
from cronlock_sidecar.lock.model import annotations_of, read_lease, with_token
from cronlock_sidecar.lock.permits import permit_key, permits_of, read_entry

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


def held_refusal(holder: str, since_micros: int, duration_seconds: int, permit: int = 0) -> str:
    """The store's refusal of a change of holder, worded as the holders' policy's."""
    what = "the lock" if permit == 0 else f"permit {permit} of the lock"
    return (
        f"{HOLDER_POLICY_DENIAL} {what} is held by {holder}, renewed "
        f"{since_micros / 1_000_000:.3f}s ago on the store's clock for {duration_seconds}s; "
        "until it expires only its holder (or a later pod of its Job) may change it"
    )


def version_read(body: dict[str, Any]) -> str:
    """The store's version the writer read this Lease at ("" when it read none)."""
    return str((body.get("metadata") or {}).get("resourceVersion") or "")


def permit_renewal_ages(body: dict[str, Any], writer_time: datetime) -> dict[int, timedelta]:
    """`renewal_age` of each held permit K ≥ 1 below the document's N (lock/permits.py)."""
    annotations = annotations_of(body)
    ages = {}
    for index in range(1, permits_of(body)):
        entry = read_entry(index, annotations.get(permit_key(index)))
        if entry.holder:
            renewed = entry.renew_time
            ages[index] = (
                timedelta(0) if renewed is None or renewed > writer_time else writer_time - renewed
            )
    return ages


def stamped(
    document: dict[str, Any],
    version: int | str,
    token: int | str,
    permit_tokens: Mapping[int, int] | None = None,
) -> dict[str, Any]:
    """The document as a reader sees it: the store's version and fencing token in place,
    and on each permit entry K ≥ 1 below N the store's token of that permit
    (`permit_tokens`; 0 where the store handed out none). Whatever the writer put in an
    entry's transitions is not the store's and is not shown."""
    metadata = {**(document.get("metadata") or {}), "resourceVersion": str(version)}
    annotations = annotations_of(document)
    tokens = permit_tokens or {}
    entries = {}
    for index in range(1, permits_of(document)):
        key = permit_key(index)
        if key in annotations:
            entry = read_entry(index, annotations[key])
            entries[key] = entry._replace(transitions=int(tokens.get(index, 0))).text()
    if entries:
        metadata["annotations"] = {**annotations, **entries}
    return with_token({**document, "metadata": metadata}, int(token))


def renewals_written(
    body: dict[str, Any], known: Mapping[str, Any] | None, writer_time: datetime
) -> tuple[timedelta | None, dict[int, timedelta]]:
    """What a write renews, dated as `renewal_age` dates it: the spec's hold (None: none)
    and each permit K ≥ 1's. With `known`, the document the write was built on (as the
    store gave it), only the holds whose spec or entry the write changes: a write carrying
    another holder's hold as it read it renews nothing of it (that renew time, moved to the
    reader's clock and back, comes out up to a round trip younger, and a hold carried by
    every other holder's renewal would never grow old)."""
    ages = permit_renewal_ages(body, writer_time)
    if known is None:
        return renewal_age(body, writer_time), ages
    spec_age = renewal_age(body, writer_time) if body.get("spec") != known.get("spec") else None
    if permits_of(known) != permits_of(body):
        return spec_age, ages
    before, after = annotations_of(known), annotations_of(body)
    changed = {
        index: age
        for index, age in ages.items()
        if after.get(permit_key(index)) != before.get(permit_key(index))
    }
    return spec_age, changed
