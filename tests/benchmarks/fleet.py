"""Many locks at once on the real fleet: N runs holding N Leases across two real nodes.

    flock /tmp/cronlock-node.lock .venv/bin/python -m tests.benchmarks fleet \\
        [--locks 200] [--hold 600] [--baseline 180]

Starts its own control plane, two real nodes (kubelet, containerd, runc) and the operator
(tests/support/environment.py's `node_and_operator`). Two phases on the same cluster, one
after the other, each with `--locks` CronJobs in one namespace and a Job made from each
(`kubectl create job --from`), every work a busybox `sleep` that reports to the work
tracker on the host:

1. **plain**: the CronJobs are not annotated, so the pods carry no sidecar: the baseline;
2. **guarded**: the CronJobs are annotated `cronlock.io/enabled: "true"` with the
   operator's defaults (ttl 60 s, renew 20 s), so every run takes its own Lease, renews
   it and is probed on `/held` by its kubelet.

A phase is measured from the moment its last work started, for `--baseline` (plain) or
`--hold` (guarded) seconds: the API server's and etcd's CPU seconds and its requests by
resource and verb (`apiserver_request_total`), the operator's CPU seconds. A watch on the
namespace's Leases records every renewal: the longest gap between two renewals of one
Lease, the renewals later than 1.5 renew periods (missed), holder changes; and the
tracker says whether any work stopped before the end. Per-second rates make the two
phases comparable: the table gives guarded / plain. Writes `.testenv/bench/fleet.json`.
A benchmark, not a test: docs/PERFORMANCE.md has the figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import secrets
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes

from tests.benchmarks.renewals import cpu_seconds, request_totals
from tests.benchmarks.runstart import cronjob
from tests.support.controlplane import ControlPlane, own_controlplane
from tests.support.cronjobs import job_from_cronjob
from tests.support.environment import node_and_operator
from tests.support.kube import wait_for
from tests.support.node import WorkTracker
from tests.support.paths import ROOT

PHASES = ("plain", "guarded")
RENEW_SECONDS = 20.0  # the operator's default renew period (ttl 60 s)
LATE = 1.5  # a renewal later than this many renew periods after the last one is missed


# --- what the API server counts ------------------------------------------------------------
def requests_by_resource(plane: ControlPlane) -> Counter[tuple[str, str]]:
    """`apiserver_request_total` by (resource, verb), from the API server's /metrics."""
    counts: Counter[tuple[str, str]] = Counter()
    for labels, count in request_totals(plane):
        counts[labels.get("resource", ""), labels.get("verb", "")] += count
    return counts


# --- every renewal, from a watch -------------------------------------------------------------
@dataclass
class LeaseLog:
    """The renewals and holders one Lease went through, as the watch saw them."""

    renewals: list[float] = field(default_factory=list)
    holders: list[str] = field(default_factory=list)

    def saw(self, holder: str | None, renewed: float | None) -> None:
        if holder and (not self.holders or self.holders[-1] != holder):
            self.holders.append(holder)
        if holder and renewed is not None and (not self.renewals or renewed > self.renewals[-1]):
            self.renewals.append(renewed)

    def gaps(self, start: float, end: float) -> list[float]:
        inside = [moment for moment in self.renewals if start <= moment <= end]
        before = [moment for moment in self.renewals if moment < start]
        points = ([before[-1]] if before else []) + inside
        return [later - earlier for earlier, later in itertools.pairwise(points)]


class LeaseWatch:
    """A watch on one namespace's Leases, in a thread, restarted when the server ends it."""

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str) -> None:
        self._api = api
        self._namespace = namespace
        self.leases: dict[str, LeaseLog] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LeaseWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()

    def _run(self) -> None:
        coordination = kubernetes.client.CoordinationV1Api(self._api)
        version = ""
        while not self._stop.is_set():
            watch = kubernetes.watch.Watch()
            try:
                for event in watch.stream(
                    coordination.list_namespaced_lease,
                    self._namespace,
                    resource_version=version,
                    timeout_seconds=60,
                ):
                    lease = event["object"]
                    version = lease.metadata.resource_version
                    spec = lease.spec
                    renewed = spec.renew_time.timestamp() if spec and spec.renew_time else None
                    self.leases.setdefault(lease.metadata.name, LeaseLog()).saw(
                        spec.holder_identity if spec else None, renewed
                    )
                    if self._stop.is_set():
                        return
            except kubernetes.client.ApiException as error:
                if error.status == 410:
                    version = ""
                    continue
                raise


# --- one phase ------------------------------------------------------------------------------
@dataclass
class Phase:
    name: str
    seconds: float
    requests: dict[str, float]  # "resource verb" -> per second
    cpu: dict[str, float]  # component -> CPU seconds per second
    works: int
    works_stopped_early: int
    nodes: dict[str, int]
    leases: dict[str, Any] | None
    failed_before_window: list[str]  # Jobs that failed while the runs were starting
    liveness_kills: int  # `Unhealthy` Events: the kubelet's probe on /held timed out


def failed_jobs(batch: kubernetes.client.BatchV1Api, namespace: str) -> set[str]:
    """The CronJobs (by name) whose run's Job failed."""
    return {
        str(job.metadata.name).removesuffix("-run")
        for job in batch.list_namespaced_job(namespace).items
        if any(c.type == "Failed" and c.status == "True" for c in job.status.conditions or [])
    }


def liveness_kills(core: kubernetes.client.CoreV1Api, namespace: str) -> int:
    events = core.list_namespaced_event(namespace, field_selector="reason=Unhealthy").items
    return sum(int(event.count or 1) for event in events)


def spread(core: kubernetes.client.CoreV1Api, namespace: str) -> dict[str, int]:
    pods = core.list_namespaced_pod(namespace).items
    return dict(Counter(pod.spec.node_name or "(none)" for pod in pods))


@contextmanager
def measured(plane: ControlPlane, operator_pid: int) -> Iterator[dict[str, Any]]:
    pids = {
        "kube-apiserver": plane.pid("kube-apiserver"),
        "etcd": plane.pid("etcd"),
        "operator": operator_pid,
    }
    cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    requests_before = requests_by_resource(plane)
    started = time.monotonic()
    out: dict[str, Any] = {}
    yield out
    seconds = time.monotonic() - started
    counted = requests_by_resource(plane) - requests_before
    out["seconds"] = seconds
    out["cpu"] = {
        name: (cpu_seconds(pid) - cpu_before[name]) / seconds for name, pid in pids.items()
    }
    out["requests"] = {
        f"{resource or '-'} {verb}": count / seconds
        for (resource, verb), count in sorted(counted.items())
        if count > 0
    }


def run_phase(
    plane: ControlPlane,
    api: kubernetes.client.ApiClient,
    tracker: WorkTracker,
    operator_pid: int,
    name: str,
    locks: int,
    seconds: float,
    pace: float,
) -> Phase:
    guarded = name == "guarded"
    namespace = f"fleet-{name}-{secrets.token_hex(3)}"
    core = kubernetes.client.CoreV1Api(api)
    batch = kubernetes.client.BatchV1Api(api)
    core.create_namespace({"metadata": {"name": namespace}})
    sleep = int(seconds) + 600  # the works outlive the window; the namespace ends them
    names = [f"{name}-{index:03d}" for index in range(locks)]
    for each in names:
        batch.create_namespaced_cron_job(
            namespace, cronjob(each, tracker, guarded, f"sleep {sleep}")
        )

    def template(each: str) -> dict[str, Any] | None:
        raw = batch.read_namespaced_cron_job(each, namespace, _preload_content=False)
        body: dict[str, Any] = json.loads(raw.data)
        spec = body["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        injected = [c["name"] for c in spec.get("initContainers") or []][:1] == ["cronlock"]
        return body if injected == guarded else None

    templates = {each: wait_for(lambda e=each: template(e), 300, f"{each} ready") for each in names}
    print(f"{name}: {locks} CronJobs ready", flush=True)
    with LeaseWatch(api, namespace) as watch:
        began = time.monotonic()
        for each in names:
            batch.create_namespaced_job(namespace, job_from_cronjob(templates[each], f"{each}-run"))
            time.sleep(pace)

        def all_started_or_ended() -> bool:
            started = {w.pod.rsplit("-", 2)[0] for w in tracker.works(f"{name}-")}
            return len(started) + len(failed_jobs(batch, namespace) - started) >= locks

        wait_for(all_started_or_ended, 1800, f"{locks} {name} works to start", every=2.0)
        start_failures = failed_jobs(batch, namespace)
        print(
            f"{name}: {locks} runs started in {time.monotonic() - began:.0f} s "
            f"({len(start_failures)} Jobs failed meanwhile)",
            flush=True,
        )
        wall_start = time.time()
        with measured(plane, operator_pid) as figures:
            time.sleep(seconds)
        wall_end = time.time()
        works = tracker.works(f"{name}-")
        stopped = sum(1 for w in works if not w.running)
        unhealthy = liveness_kills(core, namespace)
        nodes = spread(core, namespace)
        leases = None
        if guarded:
            gaps = [gap for log in watch.leases.values() for gap in log.gaps(wall_start, wall_end)]
            leases = {
                "leases": len(watch.leases),
                "renewals": len(gaps),
                "max_gap_s": max(gaps, default=0.0),
                "late": sum(1 for gap in gaps if gap > LATE * RENEW_SECONDS),
                "holder_changes": sum(
                    max(0, len(log.holders) - 1) for log in watch.leases.values()
                ),
            }
    core.delete_namespace(namespace)

    def gone() -> bool:
        try:
            core.read_namespace(namespace)
        except kubernetes.client.ApiException as error:
            return bool(error.status == 404)
        return False

    # The next phase needs the nodes' room (110 pods each): wait until every pod is gone.
    wait_for(gone, 900, f"namespace {namespace} to be deleted", every=2.0)
    return Phase(
        name,
        figures["seconds"],
        figures["requests"],
        figures["cpu"],
        len(works),
        stopped,
        nodes,
        leases,
        sorted(start_failures),
        unhealthy,
    )


def table(phases: dict[str, Phase]) -> str:
    plain, guarded = phases["plain"], phases["guarded"]
    lines = ["| per second | plain | guarded | guarded / plain |", "|---|---|---|---|"]

    def row(label: str, a: float, b: float, digits: int = 3) -> None:
        ratio = f"{b / a:.2f}" if a else "-"
        lines.append(f"| {label} | {a:.{digits}f} | {b:.{digits}f} | {ratio} |")

    for component in ("kube-apiserver", "etcd", "operator"):
        row(f"{component} CPU s/s", plain.cpu[component], guarded.cpu[component])
    row("API requests/s, all", sum(plain.requests.values()), sum(guarded.requests.values()), 2)
    for key in sorted(set(plain.requests) | set(guarded.requests)):
        a, b = plain.requests.get(key, 0.0), guarded.requests.get(key, 0.0)
        if max(a, b) >= 0.05:
            row(f"  {key}", a, b, 2)
    lines.append("")
    for phase in (plain, guarded):
        lines.append(
            f"{phase.name}: {phase.works} works ({phase.nodes}), {phase.seconds:.0f} s measured, "
            f"{phase.works_stopped_early} stopped before the end; "
            f"{len(phase.failed_before_window)} Jobs failed while starting; "
            f"{phase.liveness_kills} liveness probe failures"
        )
    if guarded.leases:
        lease = guarded.leases
        lines.append(
            f"Leases: {lease['leases']}, renewals {lease['renewals']}, longest gap "
            f"{lease['max_gap_s']:.1f} s, later than {LATE * RENEW_SECONDS:.0f} s: "
            f"{lease['late']}, holder changes {lease['holder_changes']}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks fleet", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--locks", type=int, default=200)
    parser.add_argument("--hold", type=float, default=600.0, help="guarded phase, seconds")
    parser.add_argument("--baseline", type=float, default=180.0, help="plain phase, seconds")
    parser.add_argument(
        "--pace", type=float, default=0.5, help="seconds between two Jobs created (default 0.5)"
    )
    parser.add_argument("--env-dir", type=Path, default=ROOT / ".testenv" / "bench-fleet")
    parser.add_argument("--keep-controlplane", action="store_true")
    args = parser.parse_args(argv)
    env_dir = args.env_dir.resolve()
    phases: dict[str, Phase] = {}
    with (
        own_controlplane(env_dir, args.keep_controlplane) as cluster,
        node_and_operator(cluster, env_dir, nodes=2) as around,
    ):
        assert around.operator.process is not None
        for name in PHASES:
            seconds = args.hold if name == "guarded" else args.baseline
            phases[name] = run_phase(
                cluster,
                around.api,
                around.tracker,
                around.operator.process.pid,
                name,
                args.locks,
                seconds,
                args.pace,
            )
    print(table(phases))
    out = ROOT / ".testenv" / "bench" / "fleet.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "locks": args.locks,
                "nproc": os.cpu_count(),
                "phases": {name: phase.__dict__ for name, phase in phases.items()},
            },
            indent=2,
        )
    )
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
