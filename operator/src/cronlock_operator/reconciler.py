"""What the operator does for each key of its work queue, computed from cached watch state.

The kopf event handlers keep the latest CronJobs, Jobs and Leases in memory and enqueue
keys; the work here reads those caches, decides, and writes through `Kube` only when
the cluster differs from what it should be (level-triggered, no writes when idle).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kubernetes

from cronlock_operator import metrics, skips
from cronlock_operator.cache import ObjectCache
from cronlock_operator.config import (
    InvalidConfig,
    LockConfig,
    OperatorSettings,
    is_enabled,
    parse_config,
)
from cronlock_operator.injection import desired_cronjob, injection_patch, is_injected, needs_patch
from cronlock_operator.kube import Kube
from cronlock_operator.schedule import ttl_longer_than_gap_warning
from cronlock_operator.workqueue import Retry, WorkQueue
from cronlock_sidecar import contract
from cronlock_sidecar.lockmodel import read_lease
from cronlock_sidecar.microtime import format_microtime

logger = logging.getLogger(__name__)

Key = tuple[str, ...]
DEFAULT_SERVICE_ACCOUNT = "default"


@dataclass(frozen=True)
class Guard:
    """A guarded CronJob as RBAC sees it: which Lease its pods hold, as which account."""

    lease: str
    service_account: str


@dataclass
class Observation:
    """A Lease's holder as last seen, timed on the operator's own monotonic clock."""

    holder: str
    renew_time: str | None
    duration: int
    transitions: int
    seen_at: float


@dataclass
class Reconciler:
    kube: Kube
    settings: OperatorSettings
    clock: Callable[[], float] = time.monotonic
    cronjobs: ObjectCache = field(default_factory=ObjectCache)
    jobs: ObjectCache = field(default_factory=ObjectCache)
    leases: ObjectCache = field(default_factory=ObjectCache)
    guards: dict[tuple[str, str], Guard] = field(default_factory=dict)
    observations: dict[tuple[str, str], Observation] = field(default_factory=dict)
    # Per CronJob uid: the last message of each kind we posted, so a replay posts nothing.
    posted: dict[tuple[str, str], str] = field(default_factory=dict)
    # Finished runs deleted before they were counted (the CronJob controller keeps only
    # `failedJobsHistoryLimit` failed Jobs, 1 by default): counted from their last state.
    departed: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # Uids of the Jobs this process has marked counted, until their deletion is seen: the
    # cache may still show a Job without the mark when the next accounting runs.
    accounted: set[str] = field(default_factory=set)
    # Per namespace: the (service account, lease) pairs the holder Roles grant.
    synced_rbac: dict[str, frozenset[Guard]] = field(default_factory=dict)
    queue: WorkQueue[Key] = field(init=False)
    _rbac_locks: dict[str, threading.Lock] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.queue = WorkQueue(self._work)

    # --- watch events (event loop thread) ------------------------------------------
    def on_cronjob(self, kind: str | None, body: dict[str, Any]) -> None:
        key = _key(body)
        if kind == "DELETED":
            self.cronjobs.pop(key)
        else:
            self.cronjobs.put(body)
        self.queue.add(("cronjob", *key))

    def on_job(self, kind: str | None, body: dict[str, Any]) -> None:
        key = _key(body)
        owner = skips.owning_cronjob(body)
        finished = owner is not None and skips.outcome(body) is not None
        if kind == "DELETED":
            self.jobs.pop(key)
            uid = str(body["metadata"].get("uid"))
            if uid in self.accounted:
                self.accounted.discard(uid)
            elif finished and not skips.is_accounted(body):
                self.departed[key] = body
                self.queue.add(("account", key[0], str(owner)))
            return
        self.jobs.put(body)
        if finished:
            self.queue.add(("account", key[0], str(owner)))

    def on_lease(self, kind: str | None, body: dict[str, Any]) -> None:
        key = _key(body)
        record = read_lease(body)
        # Leases made before the lock label existed get it at their CronJob's next reconcile.
        lock = record.lock or key[1].removeprefix(contract.LEASE_PREFIX)
        if kind == "DELETED":
            self.leases.pop(key)
            self.observations.pop(key, None)
            metrics.lease_held.labels(key[0], lock).set(0)
            # A guarded CronJob still needs it: its reconcile creates it again.
            for owner in body["metadata"].get("ownerReferences") or []:
                if owner.get("kind") == "CronJob":
                    self.queue.add(("cronjob", key[0], owner["name"]))
            return
        self.leases.put(body)
        holder, renew_time, transitions = record.holder, record.renew_time_text, record.transitions
        previous = self.observations.get(key)
        if previous is None or (previous.holder, previous.renew_time) != (holder, renew_time):
            if previous is not None and holder and transitions > previous.transitions:
                metrics.runs.labels("acquired").inc()
            if previous is not None and previous.holder and not holder:
                metrics.runs.labels("released").inc()
            self.observations[key] = Observation(
                holder,
                renew_time,
                record.duration_seconds or contract.DEFAULT_TTL_SECONDS,
                transitions,
                self.clock(),
            )
        metrics.lease_held.labels(key[0], lock).set(1 if holder else 0)

    def check_expiry(self) -> None:
        """Enqueue every Lease whose holder has not renewed for longer than its duration."""
        now = self.clock()
        for key, seen in list(self.observations.items()):
            if seen.holder and now - seen.seen_at > seen.duration + self.settings.skew_seconds:
                self.queue.add(("lease", *key))

    # --- work (worker tasks; the blocking API calls run in threads) -------------------
    async def _work(self, key: Key) -> None:
        kind, namespace, name = key
        handlers: dict[str, Callable[[str, str], None]] = {
            "cronjob": self.reconcile_cronjob,
            "account": self.account_runs,
            "lease": self.expire_lease,
        }
        try:
            await asyncio.to_thread(handlers[kind], namespace, name)
        except kubernetes.client.ApiException as error:
            if error.status != 404:
                raise
            # The object or its whole namespace is gone; its DELETED event tidies up.
            logger.debug("%s: gone (%s)", key, error.reason)
        except Retry:
            metrics.reconcile_errors.labels(kind).inc()
            raise

    def reconcile_cronjob(self, namespace: str, name: str) -> None:
        body = self.cronjobs.get((namespace, name))
        if body is None:
            self._forget(namespace, name)
            return
        uid = body["metadata"]["uid"]
        try:
            config = parse_config(body, self.settings) if is_enabled(body) else None
            desired = desired_cronjob(body, config, self.settings)
        except InvalidConfig as error:
            self._post_once(body, "InvalidConfig", str(error) + "; the CronJob is left as it was")
            return
        self.posted.pop((uid, "InvalidConfig"), None)

        if config is not None:
            guard = Guard(config.lease_name, _service_account(body))
            previous = self.guards.get((namespace, name))
            self.guards[(namespace, name)] = guard
            metrics.guarded_cronjobs.set(len(self.guards))
            self.kube.ensure_lease(
                namespace,
                guard.lease,
                body,
                config,
                self.leases.get((namespace, guard.lease)),
            )
            if previous is not None and previous.lease != guard.lease:
                self.kube.drop_lease_owner(namespace, previous.lease, uid)
            self._ensure_rbac(namespace, guard)
            warning = ttl_longer_than_gap_warning(config, body["spec"].get("schedule", ""))
            if warning:
                self._post_once(body, "TTLLongerThanSchedule", warning)
        else:
            self._forget(namespace, name, uid)

        if not needs_patch(body, desired):
            return
        if not self.kube.patch_cronjob(namespace, name, injection_patch(body, desired)):
            return
        if config is not None:
            self.kube.post_event(body, "Injected", _describe(config))
        elif is_injected(body):
            self.kube.post_event(
                body, "Reverted", "cronlock removed; the job template is as you wrote it"
            )

    def _forget(self, namespace: str, name: str, uid: str | None = None) -> None:
        guard = self.guards.pop((namespace, name), None)
        metrics.guarded_cronjobs.set(len(self.guards))
        if guard is None:
            return
        if uid is not None:
            self.kube.drop_lease_owner(namespace, guard.lease, uid)
        self._sync_rbac(namespace)

    def _ensure_rbac(self, namespace: str, guard: Guard) -> None:
        if guard not in self.synced_rbac.get(namespace, frozenset()):
            self._sync_rbac(namespace)

    def _sync_rbac(self, namespace: str) -> None:
        with self._lock:
            lock = self._rbac_locks.setdefault(namespace, threading.Lock())
        with lock:
            guards = {
                guard for (space, _), guard in list(self.guards.items()) if space == namespace
            }
            # CronJobs seen but not yet reconciled join now, so a burst writes the Roles once.
            for body in self.cronjobs.in_namespace(namespace):
                pending = _pending_guard(body, self.settings)
                if pending is not None:
                    guards.add(pending)
            desired = frozenset(guards)
            if self.synced_rbac.get(namespace) == desired:
                return
            leases_by_account: dict[str, list[str]] = {}
            for guard in desired:
                leases_by_account.setdefault(guard.service_account, []).append(guard.lease)
            self.kube.sync_holder_rbac(namespace, leases_by_account)
            self.synced_rbac[namespace] = desired
            logger.info(
                "holder RBAC in %s: %d leases for %d service accounts",
                namespace,
                len(desired),
                len(leases_by_account),
            )

    def account_runs(self, namespace: str, cronjob_name: str) -> None:
        """Count the finished runs of one CronJob, oldest first, each exactly once."""
        cronjob = self.kube.read_cronjob(namespace, cronjob_name)
        if cronjob is None:
            return
        try:
            config: LockConfig | None = parse_config(cronjob, self.settings)
        except InvalidConfig:
            config = None
        alert_after = config.alert_after if config else contract.DEFAULT_ALERT_AFTER
        keep = config.keep_skipped_jobs if config else False
        count = skips.consecutive_skips(cronjob)
        # Jobs still here, and those deleted before they were counted; one entry per uid
        # (a Job deleted while this runs can be in both).
        candidates: dict[str, dict[str, Any]] = {}
        for key, job in list(self.departed.items()):
            if key[0] == namespace and skips.owning_cronjob(job) == cronjob_name:
                self.departed.pop(key, None)
                candidates[str(job["metadata"].get("uid"))] = job
        for job in self.jobs.in_namespace(namespace):
            uid = str(job["metadata"].get("uid"))
            if (
                skips.owning_cronjob(job) == cronjob_name
                and skips.outcome(job) is not None
                and not skips.is_accounted(job)
                and uid not in self.accounted
            ):
                candidates.setdefault(uid, job)
        finished = sorted(
            candidates.items(), key=lambda item: str(item[1]["metadata"].get("creationTimestamp"))
        )
        start = count
        for uid, job in finished:
            job_name = job["metadata"]["name"]
            outcome = skips.outcome(job)
            # Claimed before the mark is written: a DELETED event from now on leaves it to us.
            self.accounted.add(uid)
            try:
                present = self.kube.mark_job(
                    namespace, job_name, skips.ACCOUNTED_ANNOTATION, str(outcome)
                )
            except BaseException:
                self.accounted.discard(uid)  # not counted: the retry counts it
                if (namespace, job_name) not in self.jobs:
                    self.departed[(namespace, job_name)] = job
                raise
            if present and (namespace, job_name) not in self.jobs:
                self.accounted.discard(uid)  # its deletion was already seen: nothing to wait for
            if outcome == "succeeded":
                count = 0
            elif outcome == "skipped":
                count += 1
                metrics.runs.labels("skipped").inc()
                lock = (job["metadata"].get("labels") or {}).get(contract.LABEL_LOCK, "?")
                self.kube.post_event(
                    cronjob,
                    "Skipped",
                    f"run {job_name} skipped: lock {lock} was held by another run "
                    f"({count} in a row)",
                )
                if count >= alert_after:
                    self.kube.post_event(
                        cronjob,
                        "RepeatedSkips",
                        f"{count} runs in a row skipped because lock {lock} is held; a run may "
                        f"be stuck: kubectl get lease -n {namespace} {contract.lease_name(lock)}",
                        warning=True,
                    )
                if not keep and present:
                    self.kube.delete_job(namespace, job_name)
        if count != start:
            self.kube.annotate_cronjob(
                namespace,
                cronjob_name,
                {contract.ANNOTATION_CONSECUTIVE_SKIPS: str(count) if count else None},
            )
        metrics.consecutive_skips.labels(namespace, cronjob_name).set(count)

    def expire_lease(self, namespace: str, name: str) -> None:
        """Clear a holder that stopped renewing, if it still has not renewed."""
        seen = self.observations.get((namespace, name))
        if seen is None or not seen.holder:
            return
        if self.clock() - seen.seen_at <= seen.duration + self.settings.skew_seconds:
            return
        lease = self.kube.read_lease(namespace, name)
        if lease is None:
            return
        record = read_lease(lease)
        if (record.holder, record.renew_time_text) != (seen.holder, seen.renew_time):
            return  # it renewed (or changed hands) after all; the next event updates us
        metadata = lease["metadata"]
        annotations = dict(metadata.get("annotations") or {})
        annotations[contract.ANNOTATION_LAST_HOLDER] = seen.holder
        annotations[contract.ANNOTATION_RELEASED_AT] = format_microtime(
            datetime.datetime.now(datetime.UTC)
        )
        cleared = self.kube.patch_lease(
            namespace,
            name,
            [
                {
                    "op": "test",
                    "path": "/metadata/resourceVersion",
                    "value": metadata["resourceVersion"],
                },
                {"op": "test", "path": "/spec/holderIdentity", "value": seen.holder},
                {"op": "remove", "path": "/spec/holderIdentity"},
                {"op": "add", "path": "/metadata/annotations", "value": annotations},
            ],
        )
        if not cleared:
            return  # the holder renewed in between: it is alive after all
        metrics.takeovers.labels("expired").inc()
        metrics.runs.labels("lost").inc()
        message = (
            f"lease {namespace}/{name} held by {seen.holder} was not renewed for "
            f"{self.clock() - seen.seen_at:.0f}s (duration {seen.duration}s); cleared so the "
            "next run can start"
        )
        for owner in metadata.get("ownerReferences") or []:
            cronjob = self.cronjobs.get((namespace, owner["name"]))
            if owner.get("kind") == "CronJob" and cronjob is not None:
                self.kube.post_event(cronjob, "LeaseExpired", message, warning=True)

    def _post_once(self, body: Mapping[str, Any], reason: str, message: str) -> None:
        key = (body["metadata"]["uid"], reason)
        if self.posted.get(key) == message:
            return
        self.kube.post_event(body, reason, message, warning=True)
        self.posted[key] = message


def _key(body: Mapping[str, Any]) -> tuple[str, str]:
    metadata = body["metadata"]
    return str(metadata["namespace"]), str(metadata["name"])


def _service_account(cronjob: Mapping[str, Any]) -> str:
    pod_spec = cronjob["spec"]["jobTemplate"]["spec"]["template"].get("spec") or {}
    return str(pod_spec.get("serviceAccountName") or DEFAULT_SERVICE_ACCOUNT)


def _pending_guard(cronjob: Mapping[str, Any], settings: OperatorSettings) -> Guard | None:
    try:
        if not is_enabled(cronjob):
            return None
        config = parse_config(cronjob, settings)
    except InvalidConfig:
        return None
    return Guard(config.lease_name, _service_account(cronjob))


def _describe(config: LockConfig) -> str:
    return (
        f"lock {config.lock} (lease {config.lease_name}): ttl {config.ttl_seconds}s, renew "
        f"{config.renew_seconds:g}s, policy {config.policy}, stop {config.stop}"
    )
