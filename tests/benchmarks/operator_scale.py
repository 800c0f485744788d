"""Operator at scale: time to inject N CronJobs against a plain client, memory, idle writes.

Both sides run in one session against the same local control plane, each on its own
freshly created CronJobs, so the ratio compares like with like:
- baseline: a plain Python client with as many threads as the operator has workers
  makes the operator's writes: per namespace the holder Role and RoleBinding, per
  CronJob the Lease, the JSON patch with its injection and the `Injected` Event;
- operator: the real `cronlock-operator` starts with N annotated CronJobs waiting and
  does everything it does for users (Lease, holder RBAC, patch, Event).
Then, with nothing changing, it counts the writes the operator makes while idle and
across a restart (goal: zero).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kubernetes
import urllib3

from cronlock_operator import rbac
from cronlock_operator.config import OperatorSettings, parse_config
from cronlock_operator.cronjobs import describe
from cronlock_operator.injection import build_injection
from cronlock_operator.kube import Kube
from cronlock_operator.patching import injection_patch
from cronlock_operator.rbac import Guard
from cronlock_sidecar import contract
from tests.operator_process import OperatorProcess
from tests.support.controlplane import started
from tests.support.cronjobs import make_cronjob

ROOT = Path(__file__).resolve().parents[2]
from cronlock_operator.reconciler import WORKERS  # noqa: E402 - as many threads as it has workers

NAMESPACES = 10


def cronjob(name: str, annotated: bool) -> dict[str, Any]:
    return make_cronjob(
        name=name,
        namespace=None,
        schedule="0 0 1 1 *",
        annotations={"cronlock.io/enabled": "true"} if annotated else {},
        restart_policy="Never",
        containers=[{"name": "main", "image": "busybox:1.37", "command": ["true"]}],
    )


def create_many(
    api: kubernetes.client.ApiClient, prefix: str, count: int, annotated: bool
) -> list[tuple[str, str]]:
    core = kubernetes.client.CoreV1Api(api)
    batch = kubernetes.client.BatchV1Api(api)
    names = [(f"{prefix}-{index % NAMESPACES}", f"job-{index}") for index in range(count)]
    for namespace in sorted({namespace for namespace, _ in names}):
        core.create_namespace({"metadata": {"name": namespace}})

    def create(item: tuple[str, str]) -> None:
        batch.create_namespaced_cron_job(item[0], cronjob(item[1], annotated))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, names))
    return names


def delete_namespaces(api: kubernetes.client.ApiClient, namespaces: set[str]) -> None:
    """Delete the baseline's namespaces and wait until they are gone."""
    core = kubernetes.client.CoreV1Api(api)
    for namespace in namespaces:
        core.delete_namespace(namespace)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        left = {item.metadata.name for item in core.list_namespace().items} & namespaces
        if not left:
            return
        time.sleep(1)
    raise SystemExit(f"namespaces {sorted(namespaces)} not deleted in 10 minutes")


def baseline(api: kubernetes.client.ApiClient, names: list[tuple[str, str]]) -> float:
    """Seconds for a plain client to make the operator's writes for every CronJob.

    The same writes, through the same client calls (`Kube`): per namespace the holder Role
    and RoleBinding, per CronJob the Lease, the JSON patch with its injection and the
    `Injected` Event, with as many threads as the operator has workers. Without the
    opt-in annotation, so these CronJobs are not the operator's business afterwards.
    """
    kube = Kube(api)
    settings = OperatorSettings(sidecar_image="ghcr.io/cronlock/cronlock-sidecar:0.1.0")
    work = []
    for namespace, name in names:
        stored = kube.read_cronjob(namespace, name)
        assert stored is not None
        opted_in = copy.deepcopy(stored)
        opted_in["metadata"]["annotations"] = {"cronlock.io/enabled": "true"}
        config = parse_config(opted_in, settings)
        desired = build_injection(opted_in, config, settings)
        operations = injection_patch(stored, desired)
        patch = [op for op in operations if "annotations" not in op["path"]]
        work.append((namespace, name, stored, config, patch))
    by_namespace: dict[str, set[Guard]] = {}
    for namespace, name in names:
        by_namespace.setdefault(namespace, set()).add(Guard(contract.lease_name(name), "default"))
    rbac_actions = [
        rbac.decide(namespace, guards, None)[1][0] for namespace, guards in by_namespace.items()
    ]

    def rbac_write(action: Any) -> None:
        kube.write_holder_rbac(action.namespace, action.roles, action.bindings)

    def inject(item: tuple[str, str, dict[str, Any], Any, list[dict[str, Any]]]) -> None:
        namespace, name, stored, config, patch = item
        kube.ensure_lease(namespace, config.lease_name, stored, config, None)
        kube.patch_cronjob(namespace, name, patch)
        kube.post_event(stored, "Injected", describe(config))

    start = time.monotonic()
    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(rbac_write, rbac_actions))
        list(pool.map(inject, work))
    return time.monotonic() - start


class Watcher:
    """Collects the events of one watch from a resourceVersion on, in a thread."""

    def __init__(
        self,
        lister: Callable[..., Any],
        version: str,
        selector: str = "",
    ) -> None:
        self.events: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._watch = kubernetes.watch.Watch()
        self._thread = threading.Thread(
            target=self._run, args=(lister, version, selector), daemon=True
        )
        self._thread.start()

    def _run(self, lister: Callable[..., Any], version: str, selector: str) -> None:
        stream = self._watch.stream(
            lister, resource_version=version, label_selector=selector, timeout_seconds=600
        )
        try:
            for event in stream:
                if self._stop.is_set():
                    break
                if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    self.events.append({"type": event["type"], "object": event["raw_object"]})
        except urllib3.exceptions.ProtocolError:
            if not self._stop.is_set():
                raise  # ended by stop() otherwise

    def stop(self) -> None:
        self._stop.set()
        self._watch.stop()


def injected(obj: dict[str, Any]) -> bool:
    spec = obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return any(container["name"] == "cronlock" for container in spec.get("initContainers") or [])


def rss_kib(pid: int) -> tuple[int, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    values = {
        line.split(":")[0]: int(line.split()[1])
        for line in status.splitlines()
        if line.startswith("Vm")
    }
    return values.get("VmRSS", 0), values.get("VmHWM", 0)


def operator_run(
    api: kubernetes.client.ApiClient,
    env: dict[str, str],
    names: list[tuple[str, str]],
    workdir: Path,
) -> dict[str, Any]:
    batch = kubernetes.client.BatchV1Api(api)
    version = batch.list_cron_job_for_all_namespaces(limit=1).metadata.resource_version
    watcher = Watcher(batch.list_cron_job_for_all_namespaces, version)
    wanted = set(names)
    # As in the image (Dockerfile): two malloc arenas.
    operator_env = dict(env, MALLOC_ARENA_MAX="2")
    operator = OperatorProcess(Path(env["KUBECONFIG"]), workdir / "operator.log", operator_env)
    start = time.monotonic()
    operator.start()
    ready = time.monotonic()  # its start-up line: imports, settings, the first list
    assert operator.process is not None
    done: set[tuple[str, str]] = set()
    seen = 0
    peak = 0
    while done != wanted:
        fresh = watcher.events[seen:]
        seen += len(fresh)
        for event in fresh:
            obj = event["object"]
            key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
            if key in wanted and injected(obj):
                done.add(key)
        peak = max(peak, rss_kib(operator.process.pid)[0])
        if time.monotonic() - start > 3600:
            raise SystemExit(f"only {len(done)} of {len(wanted)} injected after an hour")
        time.sleep(0.5)
    elapsed = time.monotonic() - start
    watcher.stop()

    # Idle: nothing changes; count every write to what the operator manages.
    time.sleep(5)
    idle = count_writes(api, seconds=30)
    rss_idle, hwm = rss_kib(operator.process.pid)
    operator.restart()
    restart_writes = count_writes(api, seconds=30)
    operator.stop()
    return {
        "seconds": elapsed,
        "startup_seconds": ready - start,
        "rss_peak_mib": max(peak, hwm) / 1024,
        "rss_idle_mib": rss_idle / 1024,
        "idle_writes_30s": idle,
        "writes_30s_after_restart": restart_writes,
    }


def count_writes(api: kubernetes.client.ApiClient, seconds: float) -> int:
    """Writes to anything the operator manages, or Events, over `seconds` of no changes."""
    batch = kubernetes.client.BatchV1Api(api)
    leases = kubernetes.client.CoordinationV1Api(api)
    rbac = kubernetes.client.RbacAuthorizationV1Api(api)
    core = kubernetes.client.CoreV1Api(api)
    ours = "app.kubernetes.io/managed-by=cronlock"
    listers = [
        (batch.list_cron_job_for_all_namespaces, ""),
        (leases.list_lease_for_all_namespaces, ours),
        (rbac.list_role_for_all_namespaces, ours),
        (rbac.list_role_binding_for_all_namespaces, ours),
        (core.list_event_for_all_namespaces, ""),
    ]
    watchers = [
        Watcher(lister, lister(limit=1).metadata.resource_version, selector)
        for lister, selector in listers
    ]
    time.sleep(seconds)
    for watcher in watchers:
        watcher.stop()
    # No job runs here, so no holder renews: every write counted is the operator's.
    writes = [event for watcher in watchers for event in watcher.events]
    for event in writes:
        metadata = event["object"]["metadata"]
        print(
            f"  write while idle: {event['type']} {event['object'].get('kind')} "
            f"{metadata.get('namespace')}/{metadata.get('name')}",
            file=sys.stderr,
        )
    return len(writes)


def run(sizes: list[int]) -> dict[str, Any]:
    with started(ROOT / ".testenv" / "bench-operator") as plane:
        env = plane.env
        api = plane.api_client()
        results: dict[str, Any] = {"machine": {"nproc": os.cpu_count()}, "sizes": {}}
        for size in sizes:
            plain = create_many(api, f"plain-{size}", size, annotated=False)
            plain_seconds = baseline(api, plain)
            delete_namespaces(api, {namespace for namespace, _ in plain})
            guarded = create_many(api, f"guarded-{size}", size, annotated=True)
            workdir = ROOT / ".testenv" / "bench" / f"operator-{size}"
            workdir.mkdir(parents=True, exist_ok=True)
            measured = operator_run(api, env, guarded, workdir)
            measured["baseline_seconds"] = plain_seconds
            measured["ratio"] = measured["seconds"] / plain_seconds
            results["sizes"][str(size)] = measured
            print_row(size, measured)
        return results


def print_row(size: int, measured: dict[str, Any]) -> None:
    print(
        f"{size:>6} CronJobs: operator {measured['seconds']:.1f}s vs plain client "
        f"{measured['baseline_seconds']:.1f}s (ratio {measured['ratio']:.2f}x; goal <= 1.5x; "
        f"operator start-up {measured['startup_seconds']:.1f}s of it); "
        f"RSS peak {measured['rss_peak_mib']:.0f} MiB, idle {measured['rss_idle_mib']:.0f} MiB "
        f"(goal <= 300 MiB at 10,000); writes while idle {measured['idle_writes_30s']} in 30s, "
        f"after a restart {measured['writes_30s_after_restart']} in 30s (goal 0)",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks operator", description=__doc__
    )
    parser.add_argument("--sizes", default="1000,10000", help="comma-separated CronJob counts")
    parser.add_argument("--output", default=str(ROOT / ".testenv" / "bench" / "operator.json"))
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    results = run(sizes)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2))
    print(f"results written to {output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
