"""What the clusters ring's tests share: the minutely CronJob on each store, as a user
writes it in every cluster, whose work tells the ledger its tick; the minute clock; and
the figures each test prints and fails with."""

from __future__ import annotations

import datetime
import functools
import time

from tests.clusters.conftest import Cluster, Watched
from tests.support import gen
from tests.support.kube import wait_for
from tests.support.ledger import Tally, TickLedger, job_name_env
from tests.support.ledger import settle as ledger_settle
from tests.support.node import BUSYBOX_IMAGE, container_state, job_of
from tests.support.objects import injected
from tests.support.stores import PostgresServer, RedisServer

MINUTE = datetime.timedelta(minutes=1)
WORK = "sleep 2"
# The same CronJob on each store, in both clusters: its name is its ticks' (a Job's name).
CRONJOBS = {"redis": "every-minute-redis", "postgres": "every-minute-pg"}
# How long after a tick (or a VM's late cron, LATE seconds after it) every run of it may
# take to decide, and to work if it went ahead, on this shared 2-core machine: a limit to
# fail at, naming the runs still undecided (`settle`), not a wait.
SETTLE_TIMEOUT = 120.0


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def sleep_until(moment: datetime.datetime) -> None:
    time.sleep(max(0.0, (moment - now()).total_seconds()))


def next_minute(moment: datetime.datetime) -> datetime.datetime:
    return moment.replace(second=0, microsecond=0) + MINUTE


def settle(seen: Watched, ticks: list[datetime.datetime], timeout: float) -> None:
    """Wait until every run of each CronJob's `ticks` in the cluster `seen` watches has
    decided, and worked if it went ahead (tests/support/ledger.py); fail naming those that
    had not by `timeout`. A tick's Job is named `<cronjob>-<minutes since the epoch>`."""
    minutes = [int(tick.timestamp()) // 60 for tick in ticks]
    jobs = [f"{name}-{minute}" for name in CRONJOBS.values() for minute in minutes]
    ledger_settle(seen.pods.pods, jobs, timeout)


def store_secrets(cluster: Cluster, namespace: str, redis: RedisServer, pg: PostgresServer) -> None:
    for name, url in (
        ("locks-redis", redis.url_at(cluster.link)),
        ("locks-pg", pg.url_at(cluster.link)),
    ):
        cluster.core.create_namespaced_secret(
            namespace, {"metadata": {"name": name}, "stringData": {"url": url}}
        )


def cronjob(cluster: Cluster, namespace: str, store: str, ledger: TickLedger) -> None:
    """The CronJob, as a user writes it for both clusters, its lock in `store`; its work
    tells the ledger the tick it works, then works 2 s."""
    secret = {"redis": "locks-redis", "postgres": "locks-pg"}[store]
    body = gen.cronjob(
        CRONJOBS[store],
        gen.in_namespace(None),
        gen.with_schedule("* * * * *"),
        gen.annotated({"cronlock.io/ttl": "19s"}),
        gen.in_store(store, secret),
        gen.on_the_node(
            BUSYBOX_IMAGE, ledger.script(cluster.link, cluster.name, WORK), job_name_env()
        ),
    )
    cluster.batch.create_namespaced_cron_job(namespace, body)


def gates(watched: dict[str, Watched], cronjob: str) -> str:
    """Each cluster's Jobs of `cronjob` and how their gates ended (for the failure message)."""
    lines = []
    for name, seen in watched.items():
        for pod in seen.pods.pods():
            job = job_of(pod)
            if not job.startswith(cronjob + "-"):
                continue
            ended = container_state(pod, "cronlock-gate").get("terminated") or {}
            message = (ended.get("message") or "").strip().splitlines()[:1]
            lines.append(f"  {name} {job}: gate exit {ended.get('exitCode', '?')} {message}")
    return "\n".join(sorted(lines))


def report(store: str, counted: Tally, watched: dict[str, Watched]) -> str:
    return (
        f"{store}: {len(counted.twice)} tick(s) worked twice, {len(counted.lost)} lost, "
        f"works by cluster {dict(counted.by_cluster())}\n{counted.describe()}\n"
        f"gates:\n{gates(watched, CRONJOBS[store])}"
    )


def cronjobs_injected(
    clusters: list[Cluster], namespace: str, ledger: TickLedger
) -> datetime.datetime:
    """Create the CronJobs in each cluster early in a minute, so that the operators inject
    them before the next tick (a Job made from a CronJob not yet injected would run with no
    lock at all); that next tick, the first to count."""
    if now().second > 15:
        sleep_until(next_minute(now()) + datetime.timedelta(seconds=1))
    for cluster in clusters:
        for store in CRONJOBS:
            cronjob(cluster, namespace, store, ledger)
    for cluster in clusters:
        for name in CRONJOBS.values():
            wait_for(
                functools.partial(injected, cluster.api, namespace, name),
                timeout=40,
                what=f"cluster {cluster.name}'s operator to inject {name}",
            )
    first = next_minute(now())
    assert (first - now()).total_seconds() > 3, "injected too late to count the next tick"
    return first
