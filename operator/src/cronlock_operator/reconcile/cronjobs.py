"""The CronJob reconciler: from a cached CronJob to the writes that guard (or release) it.

`decide` is pure. It takes the annotations' one reading (`read_config`), computes the
desired job template, and returns what must happen before the holder RBAC is brought in
line (the Lease exists and is owned by this CronJob) and after it (the patch, then the
Event saying so), so that a run's pod never starts under a template whose Lease or Role
is not there yet.
"""

from __future__ import annotations

import logging
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cronlock_operator.cronjob.config import InvalidConfig, LockConfig, declined_message
from cronlock_operator.cronjob.podspec import service_account_of
from cronlock_operator.cronjob.reading import Readings, read_config
from cronlock_operator.cronjob.schedule import (
    jitter_not_shorter_than_gap_warning,
    ttl_longer_than_gap_warning,
)
from cronlock_operator.injection.build import desired_cronjob, is_injected
from cronlock_operator.injection.containers import injected_by
from cronlock_operator.injection.patching import (
    annotations_differ,
    injection_patch,
    job_template_changes,
    job_template_differs,
    job_template_fingerprint,
)
from cronlock_operator.leases import sharing
from cronlock_operator.objects import Name, name_of
from cronlock_operator.reconcile.actions import (
    Action,
    DropLeaseOwner,
    EnsureLease,
    PatchCronJob,
    PostEvent,
)
from cronlock_operator.reconcile.rbac import Guard, HolderGrants
from cronlock_operator.settings import OperatorSettings
from cronlock_sidecar import contract

logger = logging.getLogger(__name__)

LEFT_AS_IT_WAS = "; the CronJob is left as it was"
# Enrolled by its namespace's label alone, which does not guard it (config.declined_because).
DECLINED_REASON = "NotGuarded"
# cronlock.io/jitter not shorter than the schedule's shortest gap (cronjob/schedule.py).
JITTER_REASON = "JitterNotShorterThanSchedule"


@dataclass(frozen=True)
class CronJobDecision:
    """What to write for one CronJob, and what the operator remembers of it afterwards."""

    guard: Guard | None = None
    # The guarded lock's lease duration: the longest a hold of it may go unrenewed.
    lease_duration_seconds: int | None = None
    keep_guard: bool = False  # bad input: remember what we had, change nothing
    before: list[Action] = field(default_factory=list)
    # The namespace's holder RBAC is due: its reconciler is asked (an `RbacKey`).
    sync_rbac: bool = False
    # The guard's Role is not written yet: `after` waits for the holder RBAC reconcile.
    await_rbac: bool = False
    # Why its account's holder Role could not be written, as last written: refused.
    conflict: str | None = None
    after: list[Action] = field(default_factory=list)
    # Warnings posted once per message: reason -> message now posted (None: forget it).
    posted: dict[str, str | None] = field(default_factory=dict)
    # The CronJob `after` patches it into, to judge what admission stores of the patch.
    desired: Mapping[str, Any] | None = None
    # Opted in, but kept as admitted without cronlock's injection: not guarded as asked.
    stripped: bool = False


@dataclass(frozen=True)
class CronJobInput:
    """Everything `decide` reads of one CronJob, gathered before deciding (cert-manager's
    gatherer; the runtime gathers it from its caches, `lease_needed` and `users_of` say
    what to read): the CronJob; the guard last recorded for it; its lock's Lease as cached
    (None: none seen, or not guarded); that Lease's other users as cached, by name (whose
    consent joining the lock needs: a user not among them gives none); what the
    namespace's holder Roles grant, as last written (rbac.HolderGrants); the warnings
    already posted on it (reason -> message); what admission made of cronlock's last patch
    of it, if it changed it."""

    body: Mapping[str, Any]
    previous: Guard | None = None
    lease: Mapping[str, Any] | None = None
    users: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    grants: HolderGrants = field(default_factory=HolderGrants)
    posted: Mapping[str, str] = field(default_factory=dict)
    admitted: Admitted | None = None


def lease_needed(body: Mapping[str, Any], settings: OperatorSettings, readings: Readings) -> str:
    """The Lease `decide` reads for this CronJob: its lock's, when it is (validly) guarded;
    "" otherwise (`read_config`'s rule, kept per version in `readings`)."""
    config = read_config(body, settings, readings).config
    return config.lease_name if config is not None else ""


def users_of(lease: Mapping[str, Any] | None) -> list[str]:
    """The names of the CronJobs a Lease names as its lock's users: whose cached bodies
    `CronJobInput.users` holds."""
    return sorted(set(sharing.lease_users(lease).values())) if lease is not None else []


@dataclass(frozen=True)
class Admitted:
    """What admission made of cronlock's last patch of one CronJob's job template, when it
    changed it (another mutating webhook or policy): the template cronlock asked for and the
    one stored, as fingerprints. While both stay, cronlock does not write it again: another
    patch would come back the same, and a fight with the mutator would be all it did."""

    asked: str
    stored: str


ADMISSION_REASON = "ChangedByAdmission"
# Changes that leave the lock working: amounts of resources, labels and annotations.
_HARMLESS = (".resources", "metadata.labels", "metadata.annotations")


def decide(
    given: CronJobInput, settings: OperatorSettings, *, readings: Readings
) -> CronJobDecision:
    """The whole plan for one CronJob, from what was gathered of it (`given`) alone;
    `readings`: the runtime's kept readings of annotations (cronjob/reading.py).

    Bad input, the reading's `invalid` or a job template that cannot take the injection,
    is one InvalidConfig Warning and leaves the CronJob and its guard as they were."""
    body, previous, grants, posted, admitted = (
        given.body,
        given.previous,
        given.grants,
        given.posted,
        given.admitted,
    )
    metadata = body["metadata"]
    namespace, name, uid = metadata["namespace"], metadata["name"], metadata["uid"]
    reading = read_config(body, settings, readings)
    config, error = reading.config, reading.invalid
    if error is None:
        try:
            desired = desired_cronjob(body, config, settings)
        except InvalidConfig as refused:
            error = refused
    if error is not None:
        message = str(error) + LEFT_AS_IT_WAS
        return CronJobDecision(
            keep_guard=True,
            before=once(body, "InvalidConfig", message, posted),
            posted={"InvalidConfig": message},
        )

    before: list[Action] = []
    after: list[Action] = []
    updates: dict[str, str | None] = {"InvalidConfig": None}
    guard = None
    if config is not None:
        # A lock in Redis or PostgreSQL gets its Lease as well, as its registry: who uses it,
        # joined only with their consent, as a Lease lock is; no Role grants it to the pods.
        guard = Guard(config.lease_name, service_account(body), holds=not config.shared_store)
        before.append(EnsureLease(namespace, guard.lease, body, config, given.lease, given.users))
        if previous is not None and previous.lease != guard.lease:
            before.append(DropLeaseOwner(namespace, previous.lease, uid))
    elif previous is not None:
        # Not guarded any more: its Lease is no longer its.
        before.append(DropLeaseOwner(namespace, previous.lease, uid))
    # Enrolled by its namespace's label alone, and declined: not guarded (a guard it had is
    # taken back above, its injection reverted below), with one Warning saying how to guard it.
    declined = declined_message(body) if reading.opt_in == "declined" else None
    if declined is not None:
        after.extend(once(body, DECLINED_REASON, declined, posted))
    updates[DECLINED_REASON] = declined
    if config is not None:
        warning = ttl_longer_than_gap_warning(config, body["spec"].get("schedule", ""))
        if warning:
            after.extend(once(body, "TTLLongerThanSchedule", warning, posted))
            updates["TTLLongerThanSchedule"] = warning
        jitter = jitter_not_shorter_than_gap_warning(config, body["spec"].get("schedule", ""))
        if jitter:
            after.extend(once(body, JITTER_REASON, jitter, posted))
        updates[JITTER_REASON] = jitter

    skew = version_skew_warning(body)
    if skew:
        after.extend(once(body, SKEW_REASON, skew, posted))
    updates[SKEW_REASON] = skew

    # Two SHA-256 digests of a job template are only worth taking when an admission
    # answer is on record; most CronJobs never have one.
    as_admitted = admitted is not None and admitted == Admitted(
        job_template_fingerprint(desired), job_template_fingerprint(body)
    )
    patch = annotations_differ(body, desired) or (
        not as_admitted and job_template_differs(body, desired)
    )
    if patch:
        after.append(PatchCronJob(namespace, name, injection_patch(body, desired)))
        if config is not None:
            after.append(PostEvent(body, "Injected", describe(config)))
        elif is_injected(body):
            after.append(
                PostEvent(body, "Reverted", "cronlock removed; the job template is as you wrote it")
            )
    return CronJobDecision(
        guard=guard,
        lease_duration_seconds=config.timing.lease_duration_seconds if config else None,
        before=before,
        sync_rbac=guard not in grants.granted if guard is not None else previous is not None,
        await_rbac=guard is not None and guard.holds and guard not in grants.written,
        conflict=grants.conflict(guard.service_account)
        if guard is not None and guard.holds
        else None,
        after=after,
        posted=updates,
        desired=desired if patch else None,
        stripped=config is not None and not patch and as_admitted and not is_injected(body),
    )


@dataclass(frozen=True)
class Judged:
    """What admission made of cronlock's patch: what to remember (None: it changed nothing),
    the Event to post, the message now posted, and whether the injection was taken out."""

    admitted: Admitted | None
    actions: list[Action]
    posted: dict[str, str | None]
    stripped: bool = False


def admission(
    stored: Mapping[str, Any], desired: Mapping[str, Any], posted: Mapping[str, str]
) -> Judged:
    """`stored` is the API server's answer to the patch that asked for `desired`. When
    another mutator changed the job template: what to remember (`Admitted`), one Event
    saying what changed (a Warning unless only resources, labels or annotations did), and
    whether it took cronlock's injection out (then the CronJob is not guarded as asked)."""
    changes = job_template_changes(stored, desired)
    if not changes:
        return Judged(None, [], {ADMISSION_REASON: None})
    harmless = all(any(mark in change for mark in _HARMLESS) for change in changes)
    message = (
        f"admission changed cronlock's write of this CronJob ({', '.join(changes)}): cronlock "
        "keeps the job template as admitted and does not write it again until it or "
        "cronlock's settings change"
    )
    if not harmless:
        message += (
            "; this can break the lock (the gate, the sidecar's probe, command or "
            "environment): exempt the containers cronlock and cronlock-gate from the "
            "mutating webhook or policy that made it (docs/USAGE.md, other admission "
            "controllers)"
        )
    admitted = Admitted(job_template_fingerprint(desired), job_template_fingerprint(stored))
    stripped = is_injected(desired) and not is_injected(stored)
    if posted.get(ADMISSION_REASON) == message:
        return Judged(admitted, [], {}, stripped)
    event = PostEvent(stored, ADMISSION_REASON, message, warning=not harmless)
    return Judged(admitted, [event], {ADMISSION_REASON: message}, stripped)


SKEW_REASON = "SidecarVersionSkew"


def version_skew_warning(cronjob: Mapping[str, Any]) -> str | None:
    """A warning when the job template carries the sidecar of a release outside this
    operator's supported skew (contract.within_skew, docs/UPGRADING.md); None otherwise."""
    release = injected_by(cronjob)
    if release is None or contract.within_skew(release, contract.VERSION):
        return None
    return (
        f"the job template carries the sidecar injected by cronlock {release[:64]!r}, outside "
        f"what cronlock {contract.VERSION} supports (sidecars of its own minor release and "
        f"{contract.SKEW_MINORS} before or after it, docs/UPGRADING.md): cronlock injects its "
        "own sidecar now, and runs already started keep theirs until they end; upgrade or "
        "roll back one minor release at a time"
    )


def pending_guard(
    cronjob: Mapping[str, Any], settings: OperatorSettings, readings: Readings
) -> Guard | None:
    """The guard a CronJob will need once reconciled; None if it is not (validly) guarded:
    `read_config`'s rule, the one `decide` follows."""
    try:
        config = read_config(cronjob, settings, readings).config
        if config is None:
            return None
        return Guard(config.lease_name, service_account(cronjob), holds=not config.shared_store)
    except Exception:
        # Never let one CronJob's input stop the namespace's RBAC: its own reconcile
        # reports what went wrong, as a ReconcileError Event.
        logger.exception("pending guard of %s: unexpected error", _name_of(cronjob))
        return None


def pending_guards(
    bodies: Iterable[Mapping[str, Any]],
    settings: OperatorSettings,
    *,
    refused: Container[Name],
    leases: Mapping[str, Mapping[str, Any]],
    readings: Readings,
) -> set[Guard]:
    """The guards a namespace's CronJobs (`bodies`, all of them as cached), seen but maybe
    not reconciled yet, may be granted ahead of their reconcile (so a burst writes the
    holder Roles once): none for a CronJob refused for a conflict, and a Lease other
    CronJobs use only with their consent. `leases`: the namespace's cached Leases by name,
    gathered before, as `decide`'s input is."""
    bodies = list(bodies)
    by_name = {str(body["metadata"]["name"]): body for body in bodies}
    guards: set[Guard] = set()
    for body in bodies:
        if name_of(body) in refused:
            continue
        guard = pending_guard(body, settings, readings)
        if guard is None:
            continue
        lease = leases.get(guard.lease)
        lock = guard.lease.removeprefix(contract.LEASE_PREFIX)  # contract.lease_name's inverse
        if lease is None or sharing.consent(lease, body, lock, by_name.get).granted:
            guards.add(guard)
    return guards


def service_account(cronjob: Mapping[str, Any]) -> str:
    return service_account_of(cronjob)


def describe(config: LockConfig) -> str:
    where = (
        f"{config.store}, URL in Secret {config.store_secret}"
        if config.shared_store
        else f"lease {config.lease_name}"
    )
    return (
        f"lock {config.lock} ({where}): ttl {config.ttl_seconds}s, renew "
        f"{config.renew_seconds:g}s, policy {config.policy}, stop {config.stop}"
    )


def once(
    body: Mapping[str, Any], reason: str, message: str, posted: Mapping[str, str]
) -> list[Action]:
    """A Warning unless this very message was already posted on this CronJob."""
    return [] if posted.get(reason) == message else [PostEvent(body, reason, message, warning=True)]


def _name_of(cronjob: Mapping[str, Any]) -> str:
    metadata = cronjob.get("metadata") or {}
    return f"{metadata.get('namespace')}/{metadata.get('name')}"
