"""Each tick at most once, a cluster's CronJob and two VMs' cron on one store lock.

Cluster A runs the minutely CronJob (its lock in Redis, and the same in PostgreSQL);
beside it, two "VMs" on the host run the same work each minute the way a crontab line
would (docs/USAGE.md, "Outside Kubernetes"): `cronlock-sidecar run --schedule '* * * * *'
--tick-of <the CronJob's name>` on the same lock, the first a second after the minute,
the second `LATE` seconds after it (its cron fires late, its clock behind). All three
name the same tick; each tick is worked once, whichever starts first.
"""

from __future__ import annotations

import datetime
import os
import subprocess

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
from tests.support.contract import EXIT_OK, EXIT_SKIPPED
from tests.support.ledger import TickLedger, tally
from tests.support.paths import SIDECAR
from tests.support.stores import PostgresServer, RedisServer

TICKS = 3
VMS = {"vm1": datetime.timedelta(seconds=1), "vm2": datetime.timedelta(seconds=LATE)}


def vm_run(
    vm: str, namespace: str, store: str, url: str, ledger: TickLedger, address: str
) -> subprocess.Popen[str]:
    """One VM's crontab line firing now: `run --schedule` on the CronJob's lock, whose work
    tells the ledger its tick (CRONLOCK_TICK, as the job name a CronJob's Job would have)."""
    name = CRONJOBS[store]
    script = (
        'minutes=$(( $(date -u -d "$CRONLOCK_TICK" +%s) / 60 )); '
        f'echo "{name}-$minutes $CRONLOCK_TICK {vm} $$" > /dev/tcp/{address}/{ledger.port}'
        " && sleep 2"
    )
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["CRONLOCK_STORE"] = url
    argv = [str(SIDECAR), "run", "--lease", f"{namespace}/cronlock-{name}", "--ttl", "19s"]
    argv += ["--schedule", "* * * * *", "--tick-of", name, "--", "bash", "-c", script]
    return subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.timeout(600)
def test_two_vms_run_schedule_beside_a_cronjob_work_each_tick_once(
    both: tuple[str, dict[str, Watched]],
    cluster_a: Cluster,
    redis_on_links: RedisServer,
    postgres_on_links: PostgresServer,
    ledger: TickLedger,
    store_history: StoreHistory,
) -> None:
    namespace, watched = both
    store_secrets(cluster_a, namespace, redis_on_links, postgres_on_links)
    first = cronjobs_injected([cluster_a], namespace, ledger)
    ticks = [first + MINUTE * number for number in range(TICKS)]
    urls = {"redis": redis_on_links.url, "postgres": postgres_on_links.url}
    runs: list[tuple[str, subprocess.Popen[str]]] = []
    for tick in ticks:
        for vm, late in VMS.items():
            sleep_until(tick + late)
            for store, url in urls.items():
                runs.append((vm, vm_run(vm, namespace, store, url, ledger, cluster_a.link)))
    # Counted once every run has decided (and worked, if it went ahead), not at a fixed
    # time after the last tick: the VMs' runs end by themselves, the cluster's are watched.
    ended = [(vm, *run.communicate(timeout=60), run.returncode) for vm, run in runs]
    settle(watched["a"], ticks, timeout=SETTLE_TIMEOUT)
    unexpected = [run for run in ended if run[-1] not in (EXIT_OK, EXIT_SKIPPED)]
    assert not unexpected, unexpected
    entries = ledger.entries()
    assert all(entry.cluster in ("a", *VMS) for entry in entries), entries
    failures = []
    for store, name in CRONJOBS.items():
        counted = tally(entries, name, ticks)
        text = report(store, counted, watched)
        print(text)
        if counted.twice or counted.lost:
            failures.append(text)
    assert not failures, "\n\n".join(failures)
