"""The lock model: a Lease as cronlock reads it, when it is free, and the timing rule.

The sidecar (which takes and renews Leases), the operator (which creates them and clears
expired holders) and `cronlock status` (which shows them) all read a Lease through
`read_lease` (or its shorthands `holder_of`, `token_of`) and judge it with `is_expired`,
and both validators of a ttl/renew pair use `Timing.check`. Times are whole milliseconds
so that boundary values (a renew of exactly a third of the ttl, a kill grace that just
fits) are decided exactly, not by float rounding. Standard library only: it is on the
sidecar's start-up path.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol

from cronlock_sidecar.contract import (
    ANNOTATION_FROZEN_BY,
    ANNOTATION_FROZEN_REASON,
    ANNOTATION_FROZEN_STOP,
    ANNOTATION_FROZEN_UNTIL,
    ANNOTATION_HOLDER_JOB,
    ANNOTATION_LAST_HOLDER,
    ANNOTATION_OVERLAP,
    ANNOTATION_RELEASED_AT,
    ANNOTATION_REPLACED_BY,
    ANNOTATION_REPLACED_JOBS,
    ANNOTATION_SUCCEEDED_PREFIX,
    ANNOTATION_YIELD_TO,
    DEFAULT_SKEW_SECONDS,
    LABEL_LOCK,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    REPLACED_JOBS_KEPT,
)
from cronlock_sidecar.lock.ticks import TickRecord, with_record
from cronlock_sidecar.microtime import format_microtime, read_time

# A holder that has not renewed for 2/3 of the ttl (on its own monotonic clock) gives up.
RENEW_DEADLINE_NUMERATOR = 2
RENEW_DEADLINE_DENOMINATOR = 3
MIN_TTL_MS = 1000
# Without a `--kill-grace` the standalone sidecar gives a stopped command this long, or
# a third of the ttl if that is shorter; the operator computes its own (`longest_kill_grace`).
DEFAULT_KILL_GRACE_MS = 5000


class TimingError(ValueError):
    """A ttl/renew/skew combination the protocol cannot keep; `field` names the culprit."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field} {reason}")
        self.field = field
        self.reason = reason


def to_ms(seconds: float) -> int:
    """Whole milliseconds (durations are parsed with nanosecond precision)."""
    return round(seconds * 1000)


def seconds_text(ms: int | float) -> str:
    """`20s`, `6.667s`: how the timing rule's messages show a duration."""
    seconds = ms / 1000
    return f"{seconds:.0f}s" if float(seconds).is_integer() else f"{seconds:.3f}".rstrip("0") + "s"


class Timing(NamedTuple):
    """How long a Lease lasts, how often its holder renews it, how much skew contenders allow."""

    ttl_ms: int
    renew_ms: int
    skew_ms: int

    @classmethod
    def of(
        cls, ttl: float, renew: float | None = None, skew: float = DEFAULT_SKEW_SECONDS
    ) -> Timing:
        """From seconds; renew defaults to a third of the ttl (rounded down to the ms)."""
        ttl_ms = to_ms(ttl)
        renew_ms = default_renew_ms(ttl_ms) if renew is None else to_ms(renew)
        return cls(ttl_ms, renew_ms, to_ms(skew))

    @property
    def ttl(self) -> float:
        return self.ttl_ms / 1000

    @property
    def renew(self) -> float:
        return self.renew_ms / 1000

    @property
    def skew(self) -> float:
        return self.skew_ms / 1000

    @property
    def renew_deadline(self) -> float:
        """Seconds without a successful renew (monotonic) after which the holder gives up."""
        return self.ttl_ms * RENEW_DEADLINE_NUMERATOR / (RENEW_DEADLINE_DENOMINATOR * 1000)

    @property
    def lease_duration_seconds(self) -> int:
        """`spec.leaseDurationSeconds`: whole seconds, never shorter than the ttl."""
        return max(1, math.ceil(self.ttl_ms / 1000))

    def check(self) -> None:
        """The rule every holder needs, whoever configured it; TimingError names what fails."""
        if self.ttl_ms < MIN_TTL_MS:
            raise TimingError("ttl", f"must be at least {seconds_text(MIN_TTL_MS)}")
        if self.renew_ms <= 0:
            raise TimingError("renew", "must be more than 0s; the default is a third of the ttl")
        if self.renew_ms * RENEW_DEADLINE_DENOMINATOR > self.ttl_ms:
            # Two renewal attempts must fit in the renew deadline (2/3 of the ttl), or one
            # failed attempt has the run stopped as lost.
            raise TimingError(
                "renew",
                f"is too long for a ttl of {seconds_text(self.ttl_ms)}: a holder gives up after "
                f"{seconds_text(self.ttl_ms * 2 / 3)} without a successful renewal (2/3 of the "
                "ttl), and needs at least two renewal attempts before that; expected at most "
                f"{seconds_text(self.ttl_ms / 3)} (a third of the ttl)",
            )
        if self.skew_ms < 0:
            raise TimingError("skew", "must not be negative")

    def kill_grace_fits(self, grace_ms: int, detection_ms: int) -> bool:
        """Whether a run that lost the Lease is gone before anyone else may take it over.

        renew deadline + detection (how late the loss is noticed) + kill grace + skew must
        stay under the ttl, strictly: 3 (detection + grace + skew) < ttl, in whole ms.
        """
        return (
            RENEW_DEADLINE_DENOMINATOR * (detection_ms + grace_ms + self.skew_ms)
            < (RENEW_DEADLINE_DENOMINATOR - RENEW_DEADLINE_NUMERATOR) * self.ttl_ms
        )

    def longest_kill_grace(self, detection_ms: int, *, step_ms: int, most_ms: int) -> int | None:
        """The longest grace in steps of `step_ms`, at most `most_ms`, that fits; None if none."""
        grace = most_ms - most_ms % step_ms
        while grace > 0:
            if self.kill_grace_fits(grace, detection_ms):
                return grace
            grace -= step_ms
        return None

    def default_kill_grace_ms(self) -> int:
        return min(DEFAULT_KILL_GRACE_MS, self.ttl_ms // 3)


def default_renew_ms(ttl_ms: int) -> int:
    return ttl_ms // 3


def replace_wait_timeout(timing: Timing) -> float:
    """How long a replace run waits for the holder by default: ttl + skew + renew, the
    longest a live holder needs to read the request and stop, and the least that sees a
    frozen holder's Lease expire (and cleared by the operator)."""
    return (timing.ttl_ms + timing.skew_ms + timing.renew_ms) / 1000


class LeaseRecord(NamedTuple):
    """What cronlock reads from a Lease; the only parser of its holder and times."""

    namespace: str
    name: str
    resource_version: str
    lock: str | None  # the label cronlock.io/lock (Leases the operator made carry it)
    managed: bool  # labelled app.kubernetes.io/managed-by=cronlock
    owner_uids: tuple[str, ...]  # the CronJobs that own it
    holder: str  # "" when free
    acquire_time: datetime | None
    renew_time: datetime | None
    renew_time_text: str | None  # exactly as the API server returned it
    duration_seconds: int | None
    transitions: int
    holder_job: str
    last_holder: str
    released_at: datetime | None
    yield_to: str = ""  # a replace run asked the holder to yield to it
    overlap: str = ""  # the last observe run that ran while the Lease was held
    replaced_by: str = ""  # who replaced the last holder that yielded
    replaced_jobs: tuple[str, ...] = ()  # the latest Jobs whose runs were replaced
    # The annotation as written, before the rule above: what the operator's repair judges.
    replaced_jobs_text: str = ""
    frozen_until: datetime | None = None  # `cronlock freeze`: every run skips until then
    frozen_by: str = ""
    frozen_reason: str = ""
    frozen_stop: bool = False  # the run working on it stops too (`--stop-running`)

    def frozen(self, now: datetime) -> bool:
        """Frozen at `now` (on the reader's wall clock): a freeze ends by itself."""
        return self.frozen_until is not None and now < self.frozen_until

    def freeze_note(self) -> str:
        until = format_microtime(self.frozen_until) if self.frozen_until else "?"
        return f"frozen until {until} by {self.frozen_by or '?'}: {self.frozen_reason or '-'}"

    @property
    def renewed_at(self) -> datetime | None:
        """The last sign of life: the renew time, else the acquire time."""
        return self.renew_time or self.acquire_time

    @property
    def expires_at(self) -> datetime | None:
        """When the holder's hold ends unless it renews; None without a time or duration."""
        renewed = self.renewed_at
        if renewed is None or self.duration_seconds is None:
            return None
        return renewed + timedelta(seconds=self.duration_seconds)


def annotations_of(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """A Lease's annotations as the API server returns them (none, or malformed: empty)."""
    return _mapping(_mapping(body.get("metadata")).get("annotations"))


def read_lease(body: Mapping[str, Any]) -> LeaseRecord:
    """A LeaseRecord from a Lease as the API server returns it (malformed fields read as unset)."""
    metadata = _mapping(body.get("metadata"))
    spec = _mapping(body.get("spec"))
    labels = _mapping(metadata.get("labels"))
    annotations = _mapping(metadata.get("annotations"))
    owners = metadata.get("ownerReferences")
    duration = spec.get("leaseDurationSeconds")
    transitions = spec.get("leaseTransitions")
    renew_text = spec.get("renewTime")
    lock = labels.get(LABEL_LOCK)
    return LeaseRecord(
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        resource_version=str(metadata.get("resourceVersion") or ""),
        lock=lock if isinstance(lock, str) and lock else None,
        managed=labels.get(LABEL_MANAGED_BY) == MANAGED_BY,
        owner_uids=tuple(
            str(owner.get("uid"))
            for owner in (owners if isinstance(owners, list) else [])
            if isinstance(owner, Mapping) and owner.get("kind") == "CronJob"
        ),
        holder=_text(spec.get("holderIdentity")),
        acquire_time=read_time(spec.get("acquireTime")),
        renew_time=read_time(renew_text),
        renew_time_text=renew_text if isinstance(renew_text, str) and renew_text else None,
        duration_seconds=duration
        if isinstance(duration, int) and not isinstance(duration, bool)
        else None,
        transitions=transitions
        if isinstance(transitions, int) and not isinstance(transitions, bool)
        else 0,
        holder_job=_text(annotations.get(ANNOTATION_HOLDER_JOB)),
        last_holder=_text(annotations.get(ANNOTATION_LAST_HOLDER)),
        released_at=read_time(annotations.get(ANNOTATION_RELEASED_AT)),
        yield_to=_text(annotations.get(ANNOTATION_YIELD_TO)),
        overlap=_text(annotations.get(ANNOTATION_OVERLAP)),
        replaced_by=_text(annotations.get(ANNOTATION_REPLACED_BY)),
        # Only as a yield writes it (the holders' policy admits no other writer): the
        # newest REPLACED_JOBS_KEPT, and none without the replace run that caused them.
        replaced_jobs=tuple(
            job for job in _text(annotations.get(ANNOTATION_REPLACED_JOBS)).split(",") if job
        )[:REPLACED_JOBS_KEPT]
        if _text(annotations.get(ANNOTATION_REPLACED_BY))
        else (),
        replaced_jobs_text=_text(annotations.get(ANNOTATION_REPLACED_JOBS)),
        frozen_until=read_time(annotations.get(ANNOTATION_FROZEN_UNTIL)),
        frozen_by=_text(annotations.get(ANNOTATION_FROZEN_BY)),
        frozen_reason=_text(annotations.get(ANNOTATION_FROZEN_REASON)),
        frozen_stop=annotations.get(ANNOTATION_FROZEN_STOP) == "true",
    )


def holder_of(body: Mapping[str, Any]) -> str:
    """Who holds the Lease `body` ("" when free), read as `read_lease` reads it."""
    return read_lease(body).holder


def token_of(body: Mapping[str, Any]) -> int:
    """The Lease's fencing token, `spec.leaseTransitions` (0 when unset or malformed)."""
    return read_lease(body).transitions


def with_token(body: Mapping[str, Any], token: int) -> dict[str, Any]:
    """`body` with `token` as its fencing token: a store hands out its own (stores/)."""
    return {**body, "spec": {**_mapping(body.get("spec")), "leaseTransitions": token}}


def token_set(token: int) -> dict[str, Any]:
    """The JSON patch operation that sets a Lease's fencing token to `token` (the operator's
    repair of one out of range)."""
    return {"op": "replace", "path": "/spec/leaseTransitions", "value": token}


class Hold(Protocol):
    """What the expiry rule reads of a hold: a Lease's spec (LeaseRecord) or a permit's
    entry (lock/permits.py Permit)."""

    @property
    def holder(self) -> str: ...

    @property
    def renewed_at(self) -> datetime | None: ...

    @property
    def duration_seconds(self) -> int | None: ...


def is_expired(
    record: Hold,
    now: datetime,
    skew_seconds: float,
    *,
    believed_at_most: float | None = None,
) -> bool:
    """The one expiry rule: held, and not renewed for longer than its duration plus the skew.

    A holder with no readable renew or acquire time counts as expired (nothing shows it is
    alive); a missing duration counts as zero. `believed_at_most`: the longest duration
    the reader believes, whatever the holder wrote (a store lock's reader passes its own
    ttl: anyone with the store's URL can write a day-long hold, as the operator caps a
    Lease's hold at its owners' longest ttl).
    """
    if not record.holder:
        return False
    renewed = record.renewed_at
    if renewed is None:
        return True
    duration: float = record.duration_seconds or 0
    if believed_at_most is not None:
        duration = min(duration, believed_at_most)
    return (now - renewed).total_seconds() > duration + skew_seconds


# --- what a holder writes ------------------------------------------------------------
def claimed(
    current: Mapping[str, Any],
    identity: str,
    timing: Timing,
    now: datetime,
    job_name: str,
    tick: TickRecord | None = None,
) -> dict[str, Any]:
    """`current` taken by `identity`: acquire and renew time now, one more transition, and
    (a run of a tick) `tick` as its CronJob's record (lock/ticks.py): only a claim writes it."""
    body = copy.deepcopy(dict(current))
    spec = body.setdefault("spec", {})
    stamp = format_microtime(now)
    spec["holderIdentity"] = identity
    spec["acquireTime"] = stamp
    spec["renewTime"] = stamp
    spec["leaseDurationSeconds"] = timing.lease_duration_seconds
    spec["leaseTransitions"] = read_lease(current).transitions + 1
    metadata = body.setdefault("metadata", {})
    annotations = dict(metadata.get("annotations") or {})
    if job_name:
        annotations[ANNOTATION_HOLDER_JOB] = job_name
    else:
        annotations.pop(ANNOTATION_HOLDER_JOB, None)
    annotations.pop(ANNOTATION_YIELD_TO, None)  # asked of the previous holder
    if tick is not None:
        annotations = with_record(annotations, tick)
    metadata["annotations"] = annotations
    return body


def renewed(current: Mapping[str, Any], timing: Timing, now: datetime) -> dict[str, Any]:
    """`current` renewed now by its holder."""
    body = copy.deepcopy(dict(current))
    spec = body.setdefault("spec", {})
    spec["renewTime"] = format_microtime(now)
    spec["leaseDurationSeconds"] = timing.lease_duration_seconds
    return body


def released(
    current: Mapping[str, Any],
    holder: str,
    now: datetime,
    *,
    replaced_by: str = "",
    job_name: str = "",
    success: TickRecord | None = None,
) -> dict[str, Any]:
    """`current` given back (or cleared) on behalf of `holder`: no holder, the transitions
    kept, and who held it last and when it was released on record; `success`, when the
    releasing run's work succeeded, as its CronJob's success record (lock/ticks.py).

    A holder that yielded to a replace run names it (`replaced_by`) and puts its own Job
    first in the replaced Jobs, so that Job's retry pod skips.
    """
    body = copy.deepcopy(dict(current))
    spec = body.setdefault("spec", {})
    spec.pop("holderIdentity", None)
    metadata = body.setdefault("metadata", {})
    annotations = dict(metadata.get("annotations") or {})
    before = read_lease(body)
    annotations.pop(ANNOTATION_HOLDER_JOB, None)
    annotations[ANNOTATION_LAST_HOLDER] = holder
    annotations[ANNOTATION_RELEASED_AT] = format_microtime(now)
    if replaced_by:
        annotations[ANNOTATION_REPLACED_BY] = replaced_by
        if job_name:
            jobs = [job_name, *(job for job in before.replaced_jobs if job != job_name)]
            annotations[ANNOTATION_REPLACED_JOBS] = ",".join(jobs[:REPLACED_JOBS_KEPT])
    if success is not None:
        annotations = with_record(annotations, success, ANNOTATION_SUCCEEDED_PREFIX)
    metadata["annotations"] = annotations
    return body


def cleared(current: Mapping[str, Any], holder: str, now: datetime) -> list[dict[str, Any]]:
    """A JSON patch clearing `holder`'s hold of `current` (one that stopped renewing, cleared
    by the operator): it applies only while the Lease is still the version read and still
    held by `holder`, and leaves the Lease as `released` would on holder's behalf."""
    annotations = released(current, holder, now)["metadata"]["annotations"]
    return [
        {
            "op": "test",
            "path": "/metadata/resourceVersion",
            "value": read_lease(current).resource_version,
        },
        {"op": "test", "path": "/spec/holderIdentity", "value": holder},
        {"op": "remove", "path": "/spec/holderIdentity"},
        {"op": "add", "path": "/metadata/annotations", "value": annotations},
    ]


def noted(current: Mapping[str, Any], note: str, identity: str) -> dict[str, Any]:
    """`current` with a contender's note (`yield-to` or `overlap`) naming `identity`."""
    body = copy.deepcopy(dict(current))
    metadata = body.setdefault("metadata", {})
    annotations = dict(metadata.get("annotations") or {})
    annotations[note] = identity
    metadata["annotations"] = annotations
    return body


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
