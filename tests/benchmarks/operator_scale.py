"""Operator at scale: time to inject N CronJobs against a plain client, memory, idle writes.

Both sides run in one session against the same local control plane, each on its own
freshly created CronJobs, and are measured alike: from starting a process until a watch
(opened before it) has seen every CronJob injected.
- baseline: `tests/benchmarks/plain_client.py`, a process that lists the CronJobs page
  by page and makes the operator's writes with as many threads as the operator has
  workers: per namespace the holder Role and RoleBinding, per CronJob the Lease, the JSON
  patch with its injection and the `Injected` Event;
- operator: the real `cronlock-operator` starts with N annotated CronJobs waiting and
  does everything it does for users (Lease, holder RBAC, patch, Event).
For each side it also records the CPU seconds its process, the API server and etcd
spent, and the plain client's writes alone (the baseline this benchmark used before).
Then, with nothing changing, it counts the writes the operator makes while idle and
across a restart (goal: zero).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kubernetes
import urllib3

from tests.support import gen
from tests.support.controlplane import ControlPlane, started
from tests.support.operator import OperatorProcess
from tests.support.paths import ROOT

TICK = os.sysconf("SC_CLK_TCK")
NAMESPACES = 10


def create_many(
    api: kubernetes.client.ApiClient, prefix: str, count: int, annotated: bool
) -> list[tuple[str, str]]:
    core = kubernetes.client.CoreV1Api(api)
    batch = kubernetes.client.BatchV1Api(api)
    names = [(f"{prefix}-{index % NAMESPACES}", f"job-{index}") for index in range(count)]
    for namespace in sorted({namespace for namespace, _ in names}):
        core.create_namespace({"metadata": {"name": namespace}})

    def create(item: tuple[str, str]) -> None:
        batch.create_namespaced_cron_job(
            item[0],
            gen.cronjob(
                item[1],
                *gen.BY_HAND,
                *([] if annotated else [gen.not_opted_in()]),
                gen.containers({"name": "main", "image": "busybox:1.37", "command": ["true"]}),
            ),
        )

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


def baseline(plane: ControlPlane, names: list[tuple[str, str]], workdir: Path) -> dict[str, Any]:
    """The plain client's process (plain_client.py), measured as the operator is."""
    api = plane.api_client()
    done = Done(api, set(names))
    namespaces = sorted({namespace for namespace, _ in names})
    command = [sys.executable, "-m", "tests.benchmarks.plain_client", *namespaces]
    meter = SideMeter(plane)
    start = time.monotonic()
    with (workdir / "plain-client.log").open("w") as log:
        process = subprocess.Popen(
            command, cwd=ROOT, env=plane.env, stdout=subprocess.PIPE, stderr=log, text=True
        )
        injected_at, elapsed, _, _ = done.wait(start, process.pid)
        output, _ = process.communicate(timeout=600)
    if process.returncode != 0:
        raise SystemExit(f"the plain client failed ({process.returncode}): see {log.name}")
    reported = json.loads(output.strip().splitlines()[-1])
    return {
        "seconds": elapsed,
        "injected_seconds": injected_at,
        "writes_seconds": reported["writes_seconds"],
        "startup_seconds": reported["import_seconds"] + reported["list_seconds"],
        "cpu_seconds": dict(meter.spent(), client=reported["cpu_seconds"]),
        "requests": meter.served(),
    }


class SideMeter:
    """CPU seconds the API server and etcd spend from now on, and the requests it serves."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.pids = {name: plane.pid(name) for name in ("kube-apiserver", "etcd")}
        self.requests = api_requests(plane)
        self.start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def spent(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) - self.start[name] for name, pid in self.pids.items()}

    def served(self) -> dict[str, int]:
        """Requests served since, by "VERB resource" (the API server's own count)."""
        now = api_requests(self.plane)
        return {
            key: count - self.requests.get(key, 0)
            for key, count in sorted(now.items())
            if count > self.requests.get(key, 0)
        }


def wait_quiet(plane: ControlPlane, window: float = 3.0, timeout: float = 300.0) -> None:
    """Wait until the API server serves no request but ours for `window` seconds.

    Deleting a side's namespaces leaves the garbage collector and the namespace controller
    busy for a while after they are gone (a GET of every deleted Lease, for one), and
    creating CronJobs keeps the controllers busy: measured from the next side's start,
    that work would be counted against it.
    """
    deadline = time.monotonic() + timeout
    before = api_requests(plane)
    while time.monotonic() < deadline:
        time.sleep(window)
        now = api_requests(plane)
        served = {key: count - before.get(key, 0) for key, count in now.items()}
        # Non-resource GETs (health checks, discovery) cost next to nothing.
        if sum(count for key, count in served.items() if not key.startswith("GET /")) == 0:
            return
        before = now
    raise SystemExit(f"the API server was still busy after {timeout:.0f}s")


def api_requests(plane: ControlPlane) -> dict[str, int]:
    """apiserver_request_total summed by verb and resource, from the API server's /metrics."""
    counts: dict[str, int] = {}
    for line in plane.kubectl("get", "--raw", "/metrics").splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_text, _, value = line.rpartition(" ")
        labels = dict(
            pair.split("=", 1)
            for pair in labels_text[len("apiserver_request_total{") : -1].split(",")
        )
        resource = labels["resource"].strip('"')
        if labels["subresource"].strip('"'):
            resource += "/" + labels["subresource"].strip('"')
        key = f"{labels['verb'].strip(chr(34))} {resource}"
        counts[key] = counts.get(key, 0) + int(float(value))
    return counts


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Done:
    """When a side's work is done: a watch saw every CronJob injected, and another its
    `Injected` Event (the operator posts its Events in the background, after the patch).

    Both watches start before the side's process, from the current resourceVersion.
    """

    def __init__(self, api: kubernetes.client.ApiClient, wanted: set[tuple[str, str]]) -> None:
        self.wanted = wanted
        self.cronjobs = Watcher.cronjobs(api)
        self.events = Watcher.events(api)
        self.injected: set[tuple[str, str]] = set()
        self.told: set[tuple[str, str]] = set()
        self._seen = [0, 0]

    def wait(self, start: float, pid: int) -> tuple[float, float, int, list[tuple[float, int]]]:
        """Seconds from `start` until every CronJob was seen injected and until its Event
        was seen too; the peak RSS (KiB) of process `pid` meanwhile, and (seconds, KiB)
        once a second."""
        peak = 0
        timeline: list[tuple[float, int]] = []
        injected_at = 0.0
        while not (self.injected == self.wanted and self.told == self.wanted):
            self._take()
            now = time.monotonic() - start
            if not injected_at and self.injected == self.wanted:
                injected_at = now
            # The plain client may have exited before its last write is seen.
            with contextlib.suppress(FileNotFoundError):
                rss = rss_kib(pid)[0]
                peak = max(peak, rss)
                if not timeline or now - timeline[-1][0] >= 1.0:
                    timeline.append((round(now, 1), rss))
            if now > 3600:
                raise SystemExit(
                    f"after an hour {len(self.injected)} of {len(self.wanted)} injected, "
                    f"{len(self.told)} Injected Events"
                )
            time.sleep(0.1)
        self.cronjobs.stop()
        self.events.stop()
        return injected_at, time.monotonic() - start, peak, timeline

    def _take(self) -> None:
        fresh = self.cronjobs.events[self._seen[0] :]
        self._seen[0] += len(fresh)
        for event in fresh:
            obj = event["object"]
            key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
            if key in self.wanted and injected(obj):
                self.injected.add(key)
        fresh = self.events.events[self._seen[1] :]
        self._seen[1] += len(fresh)
        for event in fresh:
            obj = event["object"]
            involved = obj.get("involvedObject") or {}
            key = (involved.get("namespace"), involved.get("name"))
            if obj.get("reason") == "Injected" and key in self.wanted:
                self.told.add(key)


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
        # Parsed JSON only: the client's models would cost this process, which shares the
        # CPUs with both sides, more than the watch itself.
        stream = self._watch.stream(
            lister,
            resource_version=version,
            label_selector=selector,
            timeout_seconds=600,
            deserialize=False,
        )
        try:
            for event in stream:
                if self._stop.is_set():
                    break
                if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    self.events.append({"type": event["type"], "object": event["object"]})
        except urllib3.exceptions.ProtocolError:
            if not self._stop.is_set():
                raise  # ended by stop() otherwise

    @classmethod
    def cronjobs(cls, api: kubernetes.client.ApiClient) -> Watcher:
        """Every CronJob event from now on."""
        batch = kubernetes.client.BatchV1Api(api)
        version = batch.list_cron_job_for_all_namespaces(limit=1).metadata.resource_version
        return cls(batch.list_cron_job_for_all_namespaces, version)

    @classmethod
    def events(cls, api: kubernetes.client.ApiClient) -> Watcher:
        """Every Event (the API object) from now on."""
        core = kubernetes.client.CoreV1Api(api)
        version = core.list_event_for_all_namespaces(limit=1).metadata.resource_version
        return cls(core.list_event_for_all_namespaces, version)

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
    plane: ControlPlane, names: list[tuple[str, str]], workdir: Path
) -> dict[str, Any]:
    api = plane.api_client()
    done = Done(api, set(names))
    # As in the image (Dockerfile): two malloc arenas.
    operator_env = dict(plane.env, MALLOC_ARENA_MAX="2")
    operator = OperatorProcess(
        Path(plane.env["KUBECONFIG"]), workdir / "operator.log", operator_env
    )
    meter = SideMeter(plane)
    start = time.monotonic()
    operator.start()
    ready = time.monotonic()  # its start-up line: imports, settings, the first list
    assert operator.process is not None
    injected_at, elapsed, peak, timeline = done.wait(start, operator.process.pid)
    spent = dict(meter.spent(), operator=cpu_seconds(operator.process.pid))
    served = meter.served()

    # Idle: nothing changes; count every write to what the operator manages.
    time.sleep(5)
    idle = count_writes(api, seconds=30)
    rss_idle, hwm = rss_kib(operator.process.pid)
    operator.restart()
    restart_writes = count_writes(api, seconds=30)
    operator.stop()
    return {
        "seconds": elapsed,
        "injected_seconds": injected_at,
        "rss_timeline_kib": timeline,
        "startup_seconds": ready - start,
        "cpu_seconds": spent,
        "requests": served,
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
        api = plane.api_client()
        results: dict[str, Any] = {"machine": {"nproc": os.cpu_count()}, "sizes": {}}
        for size in sizes:
            workdir = ROOT / ".testenv" / "bench" / f"operator-{size}"
            workdir.mkdir(parents=True, exist_ok=True)
            plain = create_many(api, f"plain-{size}", size, annotated=False)
            wait_quiet(plane)
            plain_client = baseline(plane, plain, workdir)
            delete_namespaces(api, {namespace for namespace, _ in plain})
            guarded = create_many(api, f"guarded-{size}", size, annotated=True)
            wait_quiet(plane)
            measured = operator_run(plane, guarded, workdir)
            measured["plain_client"] = plain_client
            measured["ratio"] = measured["seconds"] / plain_client["seconds"]
            measured["ratio_to_writes_alone"] = measured["seconds"] / plain_client["writes_seconds"]
            results["sizes"][str(size)] = measured
            print_row(size, measured)
        return results


def print_row(size: int, measured: dict[str, Any]) -> None:
    plain = measured["plain_client"]

    def cpu(spent: dict[str, float], own: str) -> str:
        return (
            f"CPU {own} {spent[own]:.1f}s, kube-apiserver {spent['kube-apiserver']:.1f}s, "
            f"etcd {spent['etcd']:.1f}s"
        )

    print(
        f"{size:>6} CronJobs: operator {measured['seconds']:.1f}s vs plain client "
        f"{plain['seconds']:.1f}s (ratio {measured['ratio']:.2f}x; goal <= 1.5x), each from "
        f"its process start until watches saw every CronJob injected and its Injected Event "
        f"(injected alone {measured['injected_seconds']:.1f}s vs "
        f"{plain['injected_seconds']:.1f}s); start-up (imports, "
        f"first list) {measured['startup_seconds']:.1f}s vs {plain['startup_seconds']:.1f}s; "
        f"the plain client's writes alone {plain['writes_seconds']:.1f}s "
        f"(ratio {measured['ratio_to_writes_alone']:.2f}x)\n"
        f"        operator {cpu(measured['cpu_seconds'], 'operator')}; "
        f"plain client {cpu(plain['cpu_seconds'], 'client')}\n"
        f"        requests served: operator {measured['requests']}\n"
        f"        plain client {plain['requests']}\n"
        f"        RSS peak {measured['rss_peak_mib']:.0f} MiB, idle "
        f"{measured['rss_idle_mib']:.0f} MiB (goal <= 300 MiB at 10,000); writes while idle "
        f"{measured['idle_writes_30s']} in 30s, after a restart "
        f"{measured['writes_30s_after_restart']} in 30s (goal 0)",
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
