"""Permits: a lock that N runs may hold at once, all in the lock's one document.

`cronlock.io/permits: N` lets N runs hold a lock at once (docs/DECISIONS.md, "Permits and
a queue without pods"). Every permit lives in the one Lease document, so a claim stays one
compare and swap: it takes a free permit and writes its tick record together, and two
runs of one tick can never hold two permits.

- Permit 0 is the Lease's own `spec`, as `model.read_lease` reads it: with N = 1 the lock
  is exactly the lock of one holder.
- Permit K (1 ≤ K < N) is the annotation `cronlock.io/permit.K`, value
  `<holder> <acquire> <renew> <duration s> <transitions> <job>`, single spaces, times as
  MicroTime (`microtime.format_microtime`), `-` for no holder or no Job. A released permit
  keeps its transitions, so its fencing token never goes back.
- The lock's N is `cronlock.io/permits` on the document (the operator writes it on a
  Lease; `run --permits` on its own). A missing or malformed N is 1; an entry at or
  beyond N is nobody's permit and is ignored.

Each permit is judged like a one-holder lock: `model.is_expired` reads a Permit as it
reads a Lease's spec. Standard library only: it is on the sidecar's start-up path.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Final, NamedTuple

from cronlock_sidecar.contract import (
    ANNOTATION_LAST_HOLDER,
    ANNOTATION_PERMIT_PREFIX,
    ANNOTATION_PERMITS,
    ANNOTATION_RELEASED_AT,
    ANNOTATION_SUCCEEDED_PREFIX,
    MAX_PERMITS,
)
from cronlock_sidecar.lock.model import (
    LeaseRecord,
    Timing,
    annotations_of,
    claimed,
    read_lease,
    released,
    renewed,
)
from cronlock_sidecar.lock.ticks import TickRecord, with_record
from cronlock_sidecar.microtime import format_microtime, read_time

NONE: Final = "-"
_FIELD = re.compile(r"[!-~]{1,253}$")  # printable ASCII, no space
_COUNT = re.compile(r"[1-9][0-9]{0,2}$")


class Permit(NamedTuple):
    """One permit of a lock as its document says."""

    number: int  # 0 for the Lease's spec, K for cronlock.io/permit.K
    holder: str  # "" when free
    acquire_time: datetime | None
    renew_time: datetime | None
    duration_seconds: int | None
    transitions: int  # the permit's fencing token
    holder_job: str  # "" when the holder is no Job's run

    @property
    def renewed_at(self) -> datetime | None:
        return self.renew_time or self.acquire_time

    @property
    def expires_at(self) -> datetime | None:
        renewed_at = self.renewed_at
        if renewed_at is None or self.duration_seconds is None:
            return None
        return renewed_at + timedelta(seconds=self.duration_seconds)

    def text(self) -> str:
        """The annotation's value (permit K ≥ 1)."""
        return " ".join(
            (
                self.holder or NONE,
                format_microtime(self.acquire_time) if self.acquire_time else NONE,
                format_microtime(self.renew_time) if self.renew_time else NONE,
                NONE if self.duration_seconds is None else str(self.duration_seconds),
                str(self.transitions),
                self.holder_job or NONE,
            )
        )


def permit_key(index: int) -> str:
    """The annotation of permit `index` (1 ≤ index < MAX_PERMITS)."""
    if not 1 <= index < MAX_PERMITS:
        raise ValueError(f"permit {index} is kept in the Lease's spec or does not exist")
    return f"{ANNOTATION_PERMIT_PREFIX}{index}"


def read_count(text: object) -> int | None:
    """A permits value (`cronlock.io/permits`, `run --permits`): 1..MAX_PERMITS, or None."""
    if not isinstance(text, str) or not _COUNT.match(text.strip()):
        return None
    count = int(text.strip())
    return count if count <= MAX_PERMITS else None


def document_count(text: object) -> int | None:
    """N as a lock's document says it: digits alone, 1..MAX_PERMITS, else None. Stricter
    than `read_count` (a person's annotation may carry spaces): the stores' rules read a
    document's N by exactly this grammar, so a reader and a store never see two Ns."""
    if not isinstance(text, str) or not _COUNT.fullmatch(text):
        return None
    count = int(text)
    return count if count <= MAX_PERMITS else None


def permits_of(body: Mapping[str, Any]) -> int:
    """The lock's N as its document says: 1 when missing or malformed."""
    return document_count(annotations_of(body).get(ANNOTATION_PERMITS)) or 1


def read_entry(index: int, text: object) -> Permit:
    """Permit `index` (≥ 1) from its annotation's value; free when absent or malformed.

    A malformed entry holds nothing, but a readable transitions field is kept (the next
    claim counts on from it); the holders' policy admits no such write from a pod.
    """
    fields = text.split(" ") if isinstance(text, str) else []
    if len(fields) != 6 or not all(_FIELD.fullmatch(field) for field in fields):
        return Permit(index, "", None, None, None, _transitions(fields), "")
    holder, acquire, renew, duration, _transitions_text, job = fields
    return Permit(
        number=index,
        holder="" if holder == NONE else holder,
        acquire_time=read_time(acquire),
        renew_time=read_time(renew),
        duration_seconds=int(duration) if duration.isdigit() and len(duration) <= 6 else None,
        transitions=_transitions(fields),
        holder_job="" if job == NONE else job,
    )


def _transitions(fields: list[str]) -> int:
    if len(fields) == 6 and fields[4].isdigit() and len(fields[4]) <= 18:
        return int(fields[4])
    return 0


def of_record(record: LeaseRecord) -> Permit:
    """Permit 0: the Lease's own spec."""
    return Permit(
        0,
        record.holder,
        record.acquire_time,
        record.renew_time,
        record.duration_seconds,
        record.transitions,
        record.holder_job,
    )


def read_permits(body: Mapping[str, Any]) -> tuple[Permit, ...]:
    """Every permit of the lock `body`, permit 0 first: as many as the document's N."""
    annotations = annotations_of(body)
    first = of_record(read_lease(body))
    return (
        first,
        *(
            read_entry(index, annotations.get(permit_key(index)))
            for index in range(1, permits_of(body))
        ),
    )


def held_by(permits: tuple[Permit, ...], identity: str) -> Permit | None:
    """The permit `identity` holds (the first, if a hostile write gave it two), or None."""
    return next((permit for permit in permits if permit.holder == identity), None)


# --- what a holder writes ------------------------------------------------------------
def claimed_permit(
    current: Mapping[str, Any],
    index: int,
    identity: str,
    timing: Timing,
    now: datetime,
    job_name: str,
    tick: TickRecord | None = None,
) -> dict[str, Any]:
    """`current` with permit `index` taken by `identity` (one more transition on that
    permit) and, for a run of a tick, `tick` as its CronJob's record: one write."""
    if index == 0:
        return claimed(current, identity, timing, now, job_name, tick)
    before = read_entry(index, annotations_of(current).get(permit_key(index)))
    entry = Permit(
        index, identity, now, now, timing.lease_duration_seconds, before.transitions + 1, job_name
    )
    annotations = {**annotations_of(current), permit_key(index): entry.text()}
    if tick is not None:
        annotations = with_record(annotations, tick)
    return _with_annotations(current, annotations)


def renewed_permit(
    current: Mapping[str, Any], index: int, timing: Timing, now: datetime
) -> dict[str, Any]:
    """`current` with permit `index` renewed now by its holder."""
    if index == 0:
        return renewed(current, timing, now)
    before = read_entry(index, annotations_of(current).get(permit_key(index)))
    entry = before._replace(renew_time=now, duration_seconds=timing.lease_duration_seconds)
    return _with_annotations(current, {**annotations_of(current), permit_key(index): entry.text()})


def released_permit(
    current: Mapping[str, Any],
    index: int,
    holder: str,
    now: datetime,
    *,
    success: TickRecord | None = None,
) -> dict[str, Any]:
    """`current` with permit `index` given back (or cleared) on behalf of `holder`: its
    transitions kept, who released last and when on record, and `success` (the releasing
    run's work succeeded) as its CronJob's success record."""
    if index == 0:
        return released(current, holder, now, success=success)
    before = read_entry(index, annotations_of(current).get(permit_key(index)))
    entry = before._replace(holder="", holder_job="")
    annotations = {
        **annotations_of(current),
        permit_key(index): entry.text(),
        ANNOTATION_LAST_HOLDER: holder,
        ANNOTATION_RELEASED_AT: format_microtime(now),
    }
    if success is not None:
        annotations = with_record(annotations, success, ANNOTATION_SUCCEEDED_PREFIX)
    return _with_annotations(current, annotations)


def cleared_permit(
    current: Mapping[str, Any], index: int, holder: str, now: datetime
) -> list[dict[str, Any]]:
    """A JSON patch clearing `holder`'s expired hold of permit `index` (the operator's): it
    applies only while the document is the version read and the permit still `holder`'s."""
    version = {
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": read_lease(current).resource_version,
    }
    if index == 0:
        annotations = released(current, holder, now)["metadata"]["annotations"]
        return [
            version,
            {"op": "test", "path": "/spec/holderIdentity", "value": holder},
            {"op": "remove", "path": "/spec/holderIdentity"},
            {"op": "add", "path": "/metadata/annotations", "value": annotations},
        ]
    text = annotations_of(current).get(permit_key(index))
    if read_entry(index, text).holder != holder:
        raise ValueError(f"permit {index} is not held by {holder}")
    path = "/metadata/annotations/" + permit_key(index).replace("~", "~0").replace("/", "~1")
    annotations = released_permit(current, index, holder, now)["metadata"]["annotations"]
    return [
        version,
        {"op": "test", "path": path, "value": text},
        {"op": "add", "path": "/metadata/annotations", "value": annotations},
    ]


def _with_annotations(current: Mapping[str, Any], annotations: Mapping[str, str]) -> dict[str, Any]:
    body = copy.deepcopy(dict(current))
    body.setdefault("metadata", {})["annotations"] = dict(annotations)
    return body
