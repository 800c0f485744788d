"""The Lease expiry reconciler: holds that stopped renewing, or taken by a pod that is no
run of the lock, cleared; free Leases' fields out of range, put back.

It keeps what it judges by: when each hold was last seen renewed (`Observations`) and the
free Leases to repair. Each guarded CronJob's lease duration (a hold is believed only for
the longest its Lease's owners give) it reads through the CronJob reconciler's read-only
`GuardView`; a CronJob reconcile that sets one asks for its Lease's key. The deciders
(`reconcile/expiry.py`, `reconcile/repair.py`) decide; the executor writes.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cronlock_operator.cronjob.timing import MAX_TTL_SECONDS
from cronlock_operator.kube.cache import ObjectCache
from cronlock_operator.kube.calls import KubeCalls
from cronlock_operator.objects import Name
from cronlock_operator.reconcile import expiry, holders, repair
from cronlock_operator.reconcile.expiry import Observation
from cronlock_operator.reconcile.guards import GuardView
from cronlock_operator.reconcile.keys import LeaseKey
from cronlock_operator.runtime.executor import Executor
from cronlock_operator.runtime.workqueue import DONE, Result
from cronlock_operator.settings import OperatorSettings
from cronlock_sidecar.lock.model import LeaseRecord, read_lease
from cronlock_sidecar.lock.permits import permits_of, read_permits

logger = logging.getLogger(__name__)


@dataclass
class Observations:
    """Each Lease's Observation as last seen, and which of them have a holder: the expiry
    check runs every second over the held ones only (looping over every free Lease each
    second was a measurable share of the operator's time, docs/PERFORMANCE.md)."""

    _seen: dict[Name, Observation] = field(default_factory=dict)
    _held: set[Name] = field(default_factory=set)
    # A lock of N permits: each entry K ≥ 1's Observation (the spec's is in `_seen`).
    _permits: dict[Name, dict[int, Observation]] = field(default_factory=dict)

    def get(self, key: Name) -> Observation | None:
        return self._seen.get(key)

    def put(self, key: Name, seen: Observation) -> None:
        self._seen[key] = seen
        self._mark(key)

    def permits(self, key: Name) -> Mapping[int, Observation]:
        return self._permits.get(key, {})

    def put_permits(self, key: Name, seen: Mapping[int, Observation]) -> None:
        if seen:
            self._permits[key] = dict(seen)
        else:
            self._permits.pop(key, None)
        self._mark(key)

    def _mark(self, key: Name) -> None:
        spec = self._seen.get(key)
        if (spec is not None and spec.holder) or any(
            entry.holder for entry in self._permits.get(key, {}).values()
        ):
            self._held.add(key)
        else:
            self._held.discard(key)

    def cap(self, key: Name, longest_duration: int) -> None:
        """Believe the holds seen at `key` for at most `longest_duration` from when they
        were seen (its owners' longest ttl, known only once they are reconciled)."""
        seen = self._seen.get(key)
        if seen is not None and seen.duration > longest_duration:
            self._seen[key] = replace(seen, duration=longest_duration)
        entries = self._permits.get(key, {})
        for index, entry in list(entries.items()):
            if entry.duration > longest_duration:
                entries[index] = replace(entry, duration=longest_duration)

    def forget(self, key: Name) -> None:
        self._seen.pop(key, None)
        self._permits.pop(key, None)
        self._held.discard(key)

    def overdue_permits(self, key: Name, now: float, skew_seconds: float) -> list[int]:
        """The permit entries of `key` held and unchanged for longer than their duration."""
        return [
            index
            for index, entry in sorted(self._permits.get(key, {}).items())
            if entry.overdue(now, skew_seconds)
        ]

    def overdue(self, now: float, skew_seconds: float) -> Iterator[Name]:
        """The Leases with a hold (the spec's or a permit's) unchanged for longer than its
        duration plus the skew."""
        for key in list(self._held):
            seen = self._seen.get(key)
            if (seen is not None and seen.overdue(now, skew_seconds)) or self.overdue_permits(
                key, now, skew_seconds
            ):
                yield key


@dataclass
class LeaseExpiry:
    """Reconciles `LeaseKey`s: clears a holder that has not renewed for longer than its
    Lease's owners allow, and repairs a free Lease's fields."""

    kube: KubeCalls
    settings: OperatorSettings
    executor: Executor
    cronjobs: ObjectCache
    leases: ObjectCache
    clock: Callable[[], float]
    # The CronJob reconciler's (read only): per guarded CronJob, its lock's lease duration.
    # A hold is judged expired after the longest of its Lease's owners', whatever duration
    # the holder wrote on the Lease.
    guards: GuardView
    observations: Observations = field(default_factory=Observations)
    # Free Leases seen with a field out of range (reconcile/repair.py), to be put back.
    to_repair: set[Name] = field(default_factory=set)
    # Per held Lease: the holder found to be a run of its lock, or to name no pod
    # (reconcile/holders.py). A holder not in it is looked at once, when first seen.
    vetted: dict[Name, str] = field(default_factory=dict)
    # The same for the permit entries of a lock of N: (Lease, permit) -> holder.
    vetted_permits: dict[tuple[Name, int], str] = field(default_factory=dict)

    # --- what the watches tell it ------------------------------------------------------
    def lease_seen(self, key: Name, body: Mapping[str, Any], record: LeaseRecord) -> bool:
        """Note a Lease as seen now (counting a hold taken or lost); True when it has a
        field to repair, so its key is due."""
        seen, counts = expiry.observe(
            self.observations.get(key), record, self.clock(), self.longest_duration(body)
        )
        if seen is not None:
            self.executor.run(counts)
            self.observations.put(key, seen)
        previous = self.observations.permits(key)
        if previous or permits_of(body) > 1:
            entries, counted = expiry.observe_permits(
                previous, body, self.clock(), self.longest_duration(body)
            )
            self.executor.run(counted)
            self.observations.put_permits(key, entries)
        # A new holder of a permit entry: is it a run of the lock?
        due = record.managed and bool(self._unvetted_permits(key))
        if not record.holder:
            self.vetted.pop(key, None)
        elif record.managed and self.vetted.get(key) != record.holder:
            return True  # a new holder: is it a run of the lock?
        if record.managed and repair.out_of_range(body):
            self.to_repair.add(key)
            return True
        return due

    def lease_deleted(self, key: Name) -> None:
        self.observations.forget(key)
        self.to_repair.discard(key)
        self.vetted.pop(key, None)
        for vetted in [vetted for vetted in self.vetted_permits if vetted[0] == key]:
            del self.vetted_permits[vetted]

    def _unvetted_permits(self, key: Name) -> list[tuple[int, str]]:
        """The permit entries of `key` whose holder, as observed, is not known as a run's
        (forgetting the vetting of entries now free)."""
        unvetted = []
        for index, seen in self.observations.permits(key).items():
            if not seen.holder:
                self.vetted_permits.pop((key, index), None)
            elif self.vetted_permits.get((key, index)) != seen.holder:
                unvetted.append((index, seen.holder))
        return unvetted

    def longest_duration(self, lease: Mapping[str, Any]) -> int:
        """The longest lease duration among the Lease's owners as their annotations set it
        (the longest any lock may have while none of them is known yet)."""
        namespace = lease["metadata"]["namespace"]
        durations = [
            duration
            for owner in lease["metadata"].get("ownerReferences") or []
            if owner.get("kind") == "CronJob"
            and (duration := self.guards.lease_duration((namespace, owner.get("name")))) is not None
        ]
        return max(durations, default=MAX_TTL_SECONDS)

    def overdue(self) -> Iterator[Name]:
        """Every Lease whose holder has not renewed for longer than its duration."""
        return self.observations.overdue(self.clock(), self.settings.skew_seconds)

    # --- the reconcile -----------------------------------------------------------------
    def reconcile(self, key: LeaseKey) -> Result:
        """Clear a holder that stopped renewing, if it still has not renewed; put a free
        Lease's fields back in range (reconcile/repair.py).

        A hold first seen before its Lease's owners were reconciled was believed for up to
        the longest any lock may have (security review L1); once an owner's lease duration
        is known (its CronJob reconcile asks for this key), it is believed only for the
        longest its owners give."""
        name = (key.namespace, key.name)
        cached = self.leases.get(name)
        if cached is not None:
            self.observations.cap(name, self.longest_duration(cached))
        seen = self.observations.get(name)
        overdue = seen is not None and seen.overdue(self.clock(), self.settings.skew_seconds)
        entries = self.observations.overdue_permits(name, self.clock(), self.settings.skew_seconds)
        unvetted = seen is not None and bool(seen.holder) and self.vetted.get(name) != seen.holder
        unvetted_permits = self._unvetted_permits(name)
        if (
            not overdue
            and not entries
            and not unvetted
            and not unvetted_permits
            and name not in self.to_repair
        ):
            return DONE
        lease = self.kube.read_lease(key.namespace, key.name)
        if lease is None:
            return DONE
        owners = [
            cronjob
            for owner in lease["metadata"].get("ownerReferences") or []
            if owner.get("kind") == "CronJob"
            and (cronjob := self.cronjobs.get((key.namespace, owner["name"]))) is not None
        ]
        if unvetted and not overdue and self._foreign_cleared(lease, owners):
            return DONE
        if unvetted_permits and not entries and self._foreign_permit_cleared(lease, owners):
            return DONE
        self.to_repair.discard(name)
        if overdue and seen is not None:
            self.executor.run(
                expiry.decide(
                    seen, lease, owners, self.clock(), datetime.datetime.now(datetime.UTC)
                )
            )
        elif entries:
            # One clear per reconcile: each write tests the version read, and the next
            # overdue look (every second) clears the next expired permit.
            index = entries[0]
            self.executor.run(
                expiry.decide_permit(
                    self.observations.permits(name)[index],
                    index,
                    lease,
                    owners,
                    self.clock(),
                    datetime.datetime.now(datetime.UTC),
                )
            )
        else:
            self.executor.run(repair.decide(lease, owners))
        return DONE

    def _foreign_permit_cleared(
        self, lease: Mapping[str, Any], owners: Sequence[Mapping[str, Any]]
    ) -> bool:
        """`_foreign_cleared` for the permit entries of a lock of N, as just read: the first
        entry held by a pod that is no run of the lock is cleared (one write per reconcile);
        True if one was. The others are vetted, or looked at again on the next reconcile."""
        record = read_lease(lease)
        key = (record.namespace, record.name)
        if not record.managed:
            return False
        for permit in read_permits(lease)[1:]:
            vetted = (key, permit.number)
            if not permit.holder or self.vetted_permits.get(vetted) == permit.holder:
                continue
            why, pod = self._no_run(record.namespace, permit.holder, lease)
            if why is None or pod is None:
                self.vetted_permits[vetted] = permit.holder
                continue
            logger.warning(
                "lease %s/%s permit %d held by %s, no run of its lock (%s): clearing it",
                record.namespace,
                record.name,
                permit.number,
                permit.holder,
                why,
            )
            self.executor.run(
                holders.decide(
                    lease,
                    permit.holder,
                    pod,
                    why,
                    owners,
                    datetime.datetime.now(datetime.UTC),
                    permit=permit.number,
                )
            )
            return True
        return False

    def _no_run(
        self, namespace: str, holder: str, lease: Mapping[str, Any]
    ) -> tuple[str | None, Mapping[str, Any] | None]:
        """Why the pod `holder` names is no run of the lock, and that pod; (None, ...) when
        it is a run, names no pod, or names one gone or replaced (left to expiry)."""
        named = holders.named_pod(holder)
        pod = None if named is None else self.kube.read_pod(namespace, named[0])
        pod_uid = str(((pod or {}).get("metadata") or {}).get("uid", ""))
        if named is None or pod is None or not pod_uid.startswith(named[1]):
            return None, None
        job_owner = holders.controller(pod, "Job")
        job = (
            None if job_owner is None else self.kube.read_job(namespace, str(job_owner.get("name")))
        )
        return holders.not_a_run(pod, job, lease), pod

    def _foreign_cleared(
        self, lease: Mapping[str, Any], owners: Sequence[Mapping[str, Any]]
    ) -> bool:
        """Clear the Lease's holder (as just read) if it is a pod that is no run of the lock
        (reconcile/holders.py); True if it was. A holder found to be a run, or to name no
        pod that exists, is remembered as vetted and not looked at again while it holds."""
        record = read_lease(lease)
        key = (record.namespace, record.name)
        if not record.holder or not record.managed:
            return False
        named = holders.named_pod(record.holder)
        pod = None if named is None else self.kube.read_pod(record.namespace, named[0])
        pod_uid = str(((pod or {}).get("metadata") or {}).get("uid", ""))
        if named is None or pod is None or not pod_uid.startswith(named[1]):
            # Names no pod, or one gone or replaced under its name: its token died with it.
            self.vetted[key] = record.holder
            return False
        job_owner = holders.controller(pod, "Job")
        job = (
            None
            if job_owner is None
            else self.kube.read_job(record.namespace, str(job_owner.get("name")))
        )
        why = holders.not_a_run(pod, job, lease)
        if why is None:
            self.vetted[key] = record.holder
            return False
        logger.warning(
            "lease %s/%s held by %s, no run of its lock (%s): clearing it",
            record.namespace,
            record.name,
            record.holder,
            why,
        )
        self.executor.run(
            holders.decide(
                lease, record.holder, pod, why, owners, datetime.datetime.now(datetime.UTC)
            )
        )
        return True
