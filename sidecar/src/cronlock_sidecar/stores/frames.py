"""A store's clock judges a lock's age: a Lease's times moved from its writer's clock to ours.

A Lease in the API server carries its writer's wall-clock times, and every reader judges
them on its own clock; nodes of one cluster keep their clocks close (the model's skew).
A store shared by clusters cannot assume that of its clients. So a store keeps, with each
write, the writer's clock and its own at the moment of the write; a read returns the
times shifted by (store's write time - writer's) + (reader's now - store's now): the age
of every time as the store's clock measured it, expressed on the reader's clock. Only the
store's clock decides how long ago a holder renewed; the clients' clocks may be anywhere.

Both shifts err towards a younger lock (the writer's clock is read before the request is
sent, the reader's after the answer came): a holder's renewal looks at most one round
trip more recent than it was, never older, so nobody takes a lock over early.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from cronlock_sidecar.contract import ANNOTATION_RELEASED_AT
from cronlock_sidecar.lock.model import holder_of
from cronlock_sidecar.lock.permits import permit_key, permits_of, read_entry
from cronlock_sidecar.microtime import format_microtime, read_time

# The times a Lease carries as moments (frozen-until is a deadline a person set, in UTC,
# and the stores do not offer freezing: it is not moved).
SPEC_TIMES = ("renewTime", "acquireTime")
ANNOTATION_TIMES = (ANNOTATION_RELEASED_AT,)
NEVER = datetime(1970, 1, 1, tzinfo=UTC)


def shifted(document: dict[str, Any], by: timedelta) -> dict[str, Any]:
    """A copy of the Lease `document` with each of its moments moved `by`."""
    spec = dict(document.get("spec") or {})
    for field in SPEC_TIMES:
        moment = read_time(spec.get(field))
        if moment is not None:
            spec[field] = format_microtime(moment + by)
    metadata = dict(document.get("metadata") or {})
    annotations = dict(metadata.get("annotations") or {})
    for key in ANNOTATION_TIMES:
        moment = read_time(annotations.get(key))
        if moment is not None:
            annotations[key] = format_microtime(moment + by)
    for index in range(1, permits_of(document)):  # a permit entry's acquire and renew
        key = permit_key(index)
        if key in annotations:
            entry = read_entry(index, annotations[key])
            annotations[key] = entry._replace(
                acquire_time=entry.acquire_time and entry.acquire_time + by,
                renew_time=entry.renew_time and entry.renew_time + by,
            ).text()
    if annotations:
        metadata["annotations"] = annotations
    return {**document, "metadata": metadata, "spec": spec}


def to_reader(
    document: dict[str, Any],
    *,
    writer_time: datetime,
    written_at: datetime,
    store_now: datetime,
    reader_now: datetime,
    renewed_at: datetime,
    permit_renewals: Mapping[int, datetime] | None = None,
) -> dict[str, Any]:
    """The stored `document` (on its writer's clock) on the reader's, aged by the store's.

    The holder's renewTime is the store's own record of the last renewal (`renewed_at`),
    never the document's: a writer chooses the document, and a renewTime it dated in the
    future would keep the hold alive. A renewal the store dates after its own now is no
    renewal it made (a hash or row written by hand): it reads as long ago, so expired.
    The same for each held permit entry K ≥ 1 below N (lock/permits.py): its renew time is
    the store's record `permit_renewals[K]`, and with none it reads as long ago.
    """

    def on_reader(renewal: datetime | None) -> datetime:
        if renewal is None or renewal > store_now:
            return NEVER
        return reader_now - (store_now - renewal)

    reader = shifted(document, (written_at - writer_time) + (reader_now - store_now))
    spec = dict(reader.get("spec") or {})
    if holder_of(reader):
        spec["renewTime"] = format_microtime(on_reader(renewed_at))
    metadata = dict(reader.get("metadata") or {})
    annotations = dict(metadata.get("annotations") or {})
    renewals = permit_renewals or {}
    for index in range(1, permits_of(reader)):
        key = permit_key(index)
        entry = read_entry(index, annotations.get(key))
        if entry.holder:
            annotations[key] = entry._replace(renew_time=on_reader(renewals.get(index))).text()
    if annotations:
        metadata["annotations"] = annotations
    return {**reader, "metadata": metadata, "spec": spec}
