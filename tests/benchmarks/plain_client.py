"""The operator benchmark's baseline, as a process of its own: a plain client doing the
operator's job for CronJobs that wait, with nothing of the operator's machinery.

`python -m tests.benchmarks.plain_client NAMESPACE...` (KUBECONFIG set): lists the
CronJobs of those namespaces page by page (as the operator's start-up does), then makes
the operator's writes with as many threads as it has workers, through the same client
calls (`Kube`): per namespace the holder Role and RoleBinding, per CronJob the Lease, the
JSON patch with its injection and the `Injected` Event. No watch, no cache beyond the
list, no reconcile loop. Prints one JSON line: when its imports were done, when it had
listed, how long the writes alone took, and its own CPU seconds.

The CronJobs carry no opt-in annotation (they are opted in here, in memory only), so
the operator would leave them alone.
"""

from __future__ import annotations

import time

STARTED = time.monotonic()

import copy  # noqa: E402 - the clock above includes the imports below
import json  # noqa: E402
import sys  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from typing import Any  # noqa: E402

from cronlock_operator.cronjob.config import parse_config  # noqa: E402
from cronlock_operator.injection.build import build_injection  # noqa: E402
from cronlock_operator.injection.patching import injection_patch  # noqa: E402
from cronlock_operator.kube.cache import ObjectCache  # noqa: E402
from cronlock_operator.kube.client import api_client  # noqa: E402
from cronlock_operator.kube.writes import Kube  # noqa: E402
from cronlock_operator.leases.ownership import new_lease  # noqa: E402
from cronlock_operator.reconcile import rbac  # noqa: E402
from cronlock_operator.reconcile.cronjobs import describe  # noqa: E402
from cronlock_operator.reconcile.rbac import Guard  # noqa: E402
from cronlock_operator.runtime.executor import Executor  # noqa: E402
from cronlock_operator.runtime.reconciler import WORKERS  # noqa: E402
from cronlock_operator.settings import OperatorSettings  # noqa: E402
from cronlock_sidecar import contract  # noqa: E402

SIDECAR_IMAGE = "ghcr.io/cronlock/cronlock-sidecar:0.1.0"


def main(namespaces: list[str]) -> int:
    imported = time.monotonic()
    kube = Kube(api_client(pool_size=WORKERS + 2))
    settings = OperatorSettings(sidecar_image=SIDECAR_IMAGE)
    listed = ObjectCache()
    kube.list_cronjobs(namespaces, listed)
    work = []
    by_namespace: dict[str, set[Guard]] = {}
    keys = listed.keys()
    for key in keys:
        stored = listed.get(key)
        assert stored is not None
        opted_in = copy.deepcopy(stored)
        opted_in["metadata"]["annotations"] = {"cronlock.io/enabled": "true"}
        config = parse_config(opted_in, settings)
        desired = build_injection(opted_in, config, settings)
        patch = [op for op in injection_patch(stored, desired) if "annotations" not in op["path"]]
        work.append((key, stored, config, patch))
        by_namespace.setdefault(key[0], set()).add(Guard(contract.lease_name(key[1]), "default"))
    rbac_actions = [
        rbac.decide(namespace, guards, None)[1][0] for namespace, guards in by_namespace.items()
    ]
    ready = time.monotonic()

    def rbac_write(action: Any) -> None:
        Executor(kube).run([action])  # a read, then a create, per Role and RoleBinding

    def inject(item: tuple[tuple[str, str], dict[str, Any], Any, list[dict[str, Any]]]) -> None:
        (namespace, name), stored, config, patch = item
        kube.create_lease(
            namespace,
            new_lease(config.lease_name, stored, config.lock, config.timing.lease_duration_seconds),
        )
        kube.patch_cronjob(namespace, name, patch)
        kube.post_event(stored, "Injected", describe(config))

    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(rbac_write, rbac_actions))
        list(pool.map(inject, work))
    done = time.monotonic()
    print(
        json.dumps(
            {
                "cronjobs": len(work),
                "import_seconds": imported - STARTED,
                "list_seconds": ready - imported,
                "writes_seconds": done - ready,
                "cpu_seconds": time.process_time(),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
