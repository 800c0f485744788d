"""Ticks: which scheduled time a run works, and the lock's record of the last one claimed.

cronlock's promise is each tick at most once, not only one run at a time (docs/USAGE.md,
"Each tick at most once"). A tick is a CronJob's name and a nominal scheduled time, the
same in every cluster whatever its clock: the CronJob controller names each scheduled Job
`<cronjob>-<minutes since the epoch>` (`tick_of_job`); `cronlock-sidecar run --schedule`
or `--tick` names it outside Kubernetes. A run's id tells one run of a tick from another:
the Job's uid (a retry pod of the same Job is the same run and may go on), or `run`'s
`--run-id`.

The lock's document (the Lease, or the store's copy of one) keeps, per CronJob, the last
tick claimed: annotation `cronlock.io/tick.<cronjob>`, value
`<tick> <job or -> <run id> <holder> <cluster or ->`, single spaces, the tick in RFC 3339
whole seconds (`2026-12-06T12:00:00Z`). Only a claim writes it (the write that makes a run
the holder); renewals and releases carry it. A run whose tick is at or before the
recorded one, claimed by another run, skips: `already ran` (`already_ran`). A recorded
tick ahead of the reader's clock (plus the skew) is nobody's tick yet and is ignored, so a
far-future tick written by a hostile pod silences nothing.

A second record per CronJob, `cronlock.io/succeeded.<cronjob>`, in the same format, is the
newest tick whose run ended in success, as its claim recorded it (`success_of`): written
by whoever knows the outcome (the operator for a Lease in a cluster, `run` at its release),
never by a pod (docs/USAGE.md, "Each tick at most once"). The work gets it as
CRONLOCK_LAST_SUCCESS_TICK, to process (last success, this tick]. Standard library only:
it is on the sidecar's start-up path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from cronlock_sidecar.contract import (
    ANNOTATION_SUCCEEDED_PREFIX,
    ANNOTATION_TICK_PREFIX,
    ENV_LAST_SUCCESS_TICK,
    ENV_MANUAL,
    ENV_PREVIOUS_TICK,
    ENV_TICK,
)

# A CronJob's name: a DNS subdomain of at most 52 characters (the API server's limit, so
# the Jobs' names with their 11-digit suffix fit 63), and here one label of it: the key
# `cronlock.io/tick.<name>` must be a valid annotation key (name part at most 63).
LONGEST_NAME = 52
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_FIELD = re.compile(r"[!-~]{1,253}$")  # printable ASCII, no space
_TICK = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})Z$")
NONE = "-"  # a field with no value (a run that is no Job's, a cluster without a name)
# The CronJob controller's suffix: minutes since the epoch, 8 digits today and for
# centuries (at most 11 digits are allowed by the name's length).
_MINUTES = re.compile(r"\d{1,11}$")
# The earliest tick a Job's name can name (26,297,280 minutes since the epoch): no CronJob
# guarded by cronlock ran before it, and smaller numbers are how people number manual runs.
FIRST_TICK = datetime(2020, 1, 1, tzinfo=UTC)


def valid_name(name: str) -> bool:
    """Whether `name` can have ticks: a CronJob's name as the API server allows it."""
    return 0 < len(name) <= LONGEST_NAME and bool(_NAME.match(name))


def record_key(cronjob: str, prefix: str = ANNOTATION_TICK_PREFIX) -> str:
    """The annotation of `cronjob`'s claim record, or (`prefix` ANNOTATION_SUCCEEDED_PREFIX)
    of its success record."""
    return prefix + cronjob


def format_tick(moment: datetime) -> str:
    """RFC 3339 in UTC, whole seconds, `Z`."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_tick(text: str) -> datetime | None:
    """A tick as `format_tick` writes it; None for anything else."""
    match = _TICK.match(text)
    if match is None:
        return None
    try:
        year, month, day, hour, minute, second = (int(part) for part in match.groups())
        return datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    except ValueError:
        return None


def tick_of_job(cronjob: str, job_name: str) -> datetime | None:
    """The tick a scheduled Job works: `<cronjob>-<minutes since the epoch>`, as the CronJob
    controller names it; None for any other name (a manual run has no tick).

    A number of minutes before FIRST_TICK names no tick either: `kubectl create job
    --from=cronjob/report report-1` (or `report-20240101`) is a manual run, not the tick of
    1970-01-01T00:01Z, which a tick claimed since would make it skip as "already ran"."""
    if not cronjob or not job_name.startswith(cronjob + "-"):
        return None
    minutes = job_name[len(cronjob) + 1 :]
    if not _MINUTES.match(minutes):
        return None
    at = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(minutes=int(minutes))
    return at if at >= FIRST_TICK else None


class Tick(NamedTuple):
    """The tick a run works and the run's id."""

    cronjob: str
    at: datetime
    job: str  # the Job's name ("" outside Kubernetes)
    run: str  # the Job's uid, or `run`'s --run-id


class TickRecord(NamedTuple):
    """What the lock says of the last tick claimed for a CronJob."""

    cronjob: str
    at: datetime
    job: str  # "" when the run was no Job's
    run: str
    holder: str
    cluster: str  # "" when unnamed

    def text(self) -> str:
        return " ".join(
            (format_tick(self.at), self.job or NONE, self.run, self.holder, self.cluster or NONE)
        )

    def who(self) -> str:
        """`job <job> (run <run>, pod <holder>, cluster <cluster>)`, for lines and status."""
        cluster = f", cluster {self.cluster}" if self.cluster else ""
        job = f"job {self.job}" if self.job else "a run"
        return f"{job} (run {self.run}, holder {self.holder}{cluster})"


def record_of(tick: Tick, holder: str, cluster: str) -> TickRecord:
    return TickRecord(tick.cronjob, tick.at, tick.job, tick.run, holder, cluster)


def read_record(
    annotations: Mapping[str, object], cronjob: str, prefix: str = ANNOTATION_TICK_PREFIX
) -> TickRecord | None:
    """The record for `cronjob` (its claim record, or the one `prefix` names); None when
    there is none or it does not read as one."""
    value = annotations.get(record_key(cronjob, prefix))
    if not isinstance(value, str):
        return None
    fields = value.split(" ")
    if len(fields) != 5 or not all(_FIELD.match(field) for field in fields):
        return None
    at = parse_tick(fields[0])
    if at is None:
        return None
    job, run, holder, cluster = fields[1:]
    return TickRecord(
        cronjob, at, "" if job == NONE else job, run, holder, "" if cluster == NONE else cluster
    )


def records(
    annotations: Mapping[str, object], prefix: str = ANNOTATION_TICK_PREFIX
) -> list[TickRecord]:
    """Every readable record (claim records, or those `prefix` names) on a lock, by
    CronJob name."""
    found = []
    for key in sorted(annotations):
        if isinstance(key, str) and key.startswith(prefix):
            record = read_record(annotations, key.removeprefix(prefix), prefix)
            if record is not None:
                found.append(record)
    return found


def believed(record: TickRecord | None, now: datetime, skew_seconds: float) -> TickRecord | None:
    """The record, unless its tick is ahead of `now` plus the skew: nobody's tick yet."""
    if record is None or record.at > now + timedelta(seconds=skew_seconds):
        return None
    return record


def already_ran(
    tick: Tick | None, record: TickRecord | None, now: datetime, skew_seconds: float
) -> TickRecord | None:
    """The record that says `tick` was already worked by another run, or None: the run may
    claim (no tick: a manual run; no believed record; a newer tick; or the same run)."""
    record = believed(record, now, skew_seconds)
    if tick is None or record is None:
        return None
    if record.at >= tick.at and record.run != tick.run:
        return record
    return None


def with_record(
    annotations: Mapping[str, str], record: TickRecord, prefix: str = ANNOTATION_TICK_PREFIX
) -> dict[str, str]:
    """`annotations` with `record` as its CronJob's (claim record, or the one `prefix` names)."""
    return {**annotations, record_key(record.cronjob, prefix): record.text()}


def read_success(annotations: Mapping[str, object], cronjob: str) -> TickRecord | None:
    """`cronjob`'s success record: the newest tick whose run succeeded, as claimed."""
    return read_record(annotations, cronjob, ANNOTATION_SUCCEEDED_PREFIX)


def success_of(
    annotations: Mapping[str, object],
    cronjob: str,
    at: datetime,
    run: str,
    now: datetime,
    skew_seconds: float,
) -> TickRecord | None:
    """The success record to write now that run `run` of `cronjob`'s tick `at` succeeded:
    its claim record as the lock has it, when that still names this run and tick, is
    believed (not ahead of `now` plus the skew) and is newer than the believed recorded
    success; None otherwise (a later claim came, the run was no claim of that tick, or a
    success as new is recorded already)."""
    claim = believed(read_record(annotations, cronjob), now, skew_seconds)
    if claim is None or claim.at != at or claim.run != run:
        return None
    recorded = believed(read_success(annotations, cronjob), now, skew_seconds)
    if recorded is not None and recorded.at >= claim.at:
        return None
    return claim


def told(
    tick: Tick | None, previous: TickRecord | None, last_success: TickRecord | None
) -> dict[str, str]:
    """What the work is told of its tick (tick.env in a pod, `run`'s command environment):
    the tick ("" and manual for a run that is no tick's), the tick the lock recorded before
    this run's claim and its last successful tick ("" if none)."""

    def text(at: datetime | None) -> str:
        return "" if at is None else format_tick(at)

    return {
        ENV_TICK: text(tick.at if tick else None),
        ENV_PREVIOUS_TICK: text(previous.at if previous else None),
        ENV_LAST_SUCCESS_TICK: text(last_success.at if last_success else None),
        ENV_MANUAL: "false" if tick else "true",
    }


def skip_line(tick: Tick, record: TickRecord, lock: str) -> str:
    """The run's one line: `already ran: ...` (contract.ALREADY_RAN)."""
    return (
        f"already ran: tick {format_tick(tick.at)} of {tick.cronjob} on lock {lock} was "
        f"claimed by {record.who()} for tick {format_tick(record.at)}; skipping this run"
    )
