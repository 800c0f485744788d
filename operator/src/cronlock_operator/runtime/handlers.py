"""kopf wiring: thin event handlers that feed the reconciler's caches and work queue.

Only low-level event handlers are used: they leave no annotations, finalizers or status
on anyone's objects (users' CronJobs stay exactly as they and we wrote them), and the
reconciler's own queue supplies the retries kopf gives only to stateful handlers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Iterable
from typing import Any, cast

import kopf

from cronlock_operator.kube.client import api_client
from cronlock_operator.kube.writes import LIST_PAGE, Kube
from cronlock_operator.runtime import liveness
from cronlock_operator.runtime.events import EventPoster
from cronlock_operator.runtime.liveness import Liveness
from cronlock_operator.runtime.reconciler import WORKERS, Reconciler
from cronlock_operator.settings import OperatorSettings
from cronlock_sidecar import contract

logger = logging.getLogger(__name__)
DUE_CHECK_SECONDS = 1.0
# What the Job and Lease handlers take, as label selectors sent with the watches: the API
# server then filters (every node's Lease renews every 10 s, and most Jobs are not ours),
# and the handlers' own `labels=` filters below stay as the same rule, applied again.
JOB_SELECTOR = contract.LABEL_LOCK
LEASE_SELECTOR = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
NAMESPACES = ("", "namespaces")
SERVER_SIDE_SELECTORS = {
    ("batch", "jobs"): JOB_SELECTOR,
    ("coordination.k8s.io", "leases"): LEASE_SELECTOR,
}


class NoDiffBase(kopf.DiffBaseStorage):
    """No last-handled state to keep: only event handlers are registered, which kopf never
    diffs. Its default storage still deep-copied every event's object to build one, a
    visible share of the event loop's time at scale (docs/PERFORMANCE.md)."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def select_server_side(settings: kopf.OperatorSettings) -> None:
    """Send the Job and Lease handlers' label filters with their watches."""
    for resource, selector in SERVER_SIDE_SELECTORS.items():
        settings.watching.label_selectors[resource] = selector


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.peering.standalone = True
    settings.posting.enabled = False  # our Events are explicit, not log lines
    settings.scanning.disabled = True  # no CRD watching: cronlock needs no CRDs
    settings.persistence.diffbase_storage = NoDiffBase()
    # A per-object kopf worker lingers this long after its last event; at start-up every
    # CronJob has one at once, so a short linger bounds the operator's peak memory.
    settings.batching.idle_timeout = 1.0
    settings.watching.server_timeout = 300
    # kopf's own start-up list page by page, as ours: unpaged, 10,000 CronJobs were one
    # answer parsed at once, the operator's memory peak (docs/PERFORMANCE.md).
    settings.watching.chunk_size = LIST_PAGE
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 30
    select_server_side(settings)
    operator_settings: OperatorSettings = memo.settings
    # Enough pooled connections for every worker thread: a smaller pool discards
    # connections under load and each new one costs a TLS handshake.
    api = api_client(pool_size=WORKERS + 2)
    # The blocking API calls of every worker, plus the start-up list and the Event poster.
    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(WORKERS + 2, thread_name_prefix="cronlock")
    )
    kube = Kube(api)
    memo.events = EventPoster(kube)
    reconciler = Reconciler(
        kube,
        operator_settings,
        post_event=memo.events.post,
        watched_namespaces=frozenset(memo.namespaces),
    )
    if memo.namespace_opt_in:
        # Before any CronJob is decided: its namespace's label is part of the decision.
        # A 403 is a Retry naming the grant: kopf runs this start-up handler again.
        await asyncio.to_thread(reconciler.load_labelled_namespaces)
    # The whole list first: the holder Roles are computed from every guarded CronJob in a
    # namespace, and a Role written from half a list would revoke live holders' access.
    await asyncio.to_thread(reconciler.kube.list_cronjobs, memo.namespaces, reconciler.cronjobs)
    # And the Leases: who uses a lock, so that the grants obey consent (share-lock-with).
    await asyncio.to_thread(reconciler.load_leases, memo.namespaces)
    await reconciler.sync_all_rbac()
    reconciler.queue.start()
    memo.reconciler = reconciler
    memo.expiry_task = asyncio.create_task(_check_due(reconciler), name="cronlock-expiry")
    logger.info("cronlock operator started; sidecar image %s", operator_settings.sidecar_image)


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    memo.expiry_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await memo.expiry_task
    await memo.reconciler.queue.stop()
    await asyncio.to_thread(memo.events.stop)


async def _check_due(reconciler: Reconciler, alive: Liveness = liveness.state) -> None:
    # Each completed round tells the liveness probe the loop runs: a loop blocked, or this
    # task ended by an error, stops the beats and the kubelet restarts the operator.
    while True:
        reconciler.check_expiry()
        reconciler.check_ticks()
        alive.beat()
        await asyncio.sleep(DUE_CHECK_SECONDS)


@kopf.on.event("batch", "v1", "cronjobs")
async def cronjob_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    memo.reconciler.on_cronjob(event["type"], event["object"])


def watch_namespaces() -> None:
    """Namespace opt-in (`--namespace-opt-in`): watch the namespaces labelled
    cronlock.io/enabled=true, the API server filtering. One that loses the label leaves the
    selector, which the watch tells as DELETED, with the object as it is now: so no `labels=`
    filter here, which would drop that event (on_namespace reads the label itself)."""
    SERVER_SIDE_SELECTORS[NAMESPACES] = contract.NAMESPACE_SELECTOR
    kopf.on.event("", "v1", "namespaces")(namespace_event)


async def namespace_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    memo.reconciler.on_namespace(event["type"], event["object"])


@kopf.on.event("batch", "v1", "jobs", labels={contract.LABEL_LOCK: kopf.PRESENT})
async def job_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    memo.reconciler.on_job(event["type"], event["object"])


@kopf.on.event(
    "coordination.k8s.io",
    "v1",
    "leases",
    labels={contract.LABEL_MANAGED_BY: contract.MANAGED_BY},
)
async def lease_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    memo.reconciler.on_lease(event["type"], event["object"])
