"""Each tick at most once, across two real clusters (issue 56's "done when", on real parts).

Clusters A and B (tests/clusters/conftest.py: each its own control plane, scheduler and
node) run the same minutely CronJob, whose work takes 2 s, on one lock in Redis and the
same CronJob on one lock in PostgreSQL, side by side. B's pods start `LATE` seconds late,
so A's run of a tick has ended when B's run of it claims the lock: a lock that only keeps
runs apart lets B work the tick again. Each run's work tells the ledger which tick it
works (tests/support/ledger.py). With both clusters up, every tick is worked exactly once;
with A's control plane stopped, B works every tick alone; when A's comes back, its
controller creates the Job of the tick it missed last (a replayed tick), which B worked
already: that one is not worked again either.
"""

from __future__ import annotations

import pytest

from tests.clusters.conftest import LATE, Cluster, StoreHistory, Watched
from tests.clusters.ticks import (
    CRONJOBS,
    MINUTE,
    SETTLE_TIMEOUT,
    cronjobs_injected,
    report,
    settle,
    sleep_until,
    store_secrets,
)
from tests.support.ledger import TickLedger, disagreements, tally
from tests.support.stores import PostgresServer, RedisServer

BOTH_UP = 5  # ticks with both clusters up
STOPPED = 2  # then ticks with A's control plane stopped
AGAIN = 1  # then ticks with both up again (A's replayed tick comes first)


@pytest.mark.timeout(1200)
def test_two_clusters_work_each_tick_once_on_a_redis_and_a_postgres_lock(
    both: tuple[str, dict[str, Watched]],
    cluster_a: Cluster,
    cluster_b: Cluster,
    redis_on_links: RedisServer,
    postgres_on_links: PostgresServer,
    ledger: TickLedger,
    store_history: StoreHistory,
) -> None:
    namespace, watched = both
    for cluster in (cluster_a, cluster_b):
        store_secrets(cluster, namespace, redis_on_links, postgres_on_links)
    first = cronjobs_injected([cluster_a, cluster_b], namespace, ledger)
    ticks = [first + MINUTE * number for number in range(BOTH_UP + STOPPED + AGAIN)]
    up, stopped = ticks[:BOTH_UP], ticks[BOTH_UP : BOTH_UP + STOPPED]

    # Each phase ends once every run of its ticks has decided (and worked, if it went
    # ahead) in each cluster that runs them, not at a fixed time after its last tick.
    sleep_until(up[-1])
    for seen in watched.values():
        settle(seen, up, timeout=SETTLE_TIMEOUT)
    cluster_a.stop_controlplane()
    try:
        sleep_until(stopped[-1])
        settle(watched["b"], stopped, timeout=SETTLE_TIMEOUT)
    finally:
        cluster_a.resume_controlplane()
    sleep_until(ticks[-1])
    # A's controller, back, replays the last tick it missed: that Job decides too.
    settle(watched["a"], [stopped[-1], ticks[-1]], timeout=SETTLE_TIMEOUT)
    settle(watched["b"], ticks[-1:], timeout=SETTLE_TIMEOUT)

    entries = ledger.entries()
    assert all(entry.cluster in ("a", "b") for entry in entries), entries
    failures = []
    for store, name in CRONJOBS.items():
        counted = tally(entries, name, ticks)
        text = report(store, counted, watched)
        print(text)  # the figures, kept in the ring's log whether or not it passes
        if counted.twice or counted.lost:
            failures.append(text)
            continue
        by_a = [tick for tick in stopped if counted.works[tick][0].cluster != "b"]
        if by_a:
            failures.append(f"{store}: A's stopped control plane worked {by_a}\n{text}")
        # B's pods were late indeed: its works of the ticks it worked alone began LATE
        # seconds or more after their tick.
        early = [
            f"{tick:%H:%M} +{work.heard - tick.timestamp():.1f}s"
            for tick in stopped
            for work in counted.works[tick]
            if work.cluster == "b" and work.heard - tick.timestamp() < LATE
        ]
        if early:
            failures.append(f"{store}: B's works not {LATE:g}s late: {early}")
        if wrong := disagreements(entries, name):
            failures.append(f"{store}: tick files that name another tick: {wrong}")
    assert not failures, "\n\n".join(failures)
