"""How soon a queued run's work starts after the lock's release, on the real node (issue
58: within 2 s at p99), and where that time goes.

    flock /tmp/cronlock-e2e.lock env CRONLOCK_IMAGES_DIR=$HOME/.cache/cronlock/images/out \\
      .venv/bin/python -m tests.benchmarks queuestart [--releases 40] \\
      [--kubelet-feature-gates EventedPLEG=true]

Starts its own control plane, the real node (kubelet, containerd, runc) and the operator
(tests/support/environment.py's `node_and_operator`), makes one CronJob under
`cronlock.io/policy: queue` whose work is a short `sleep`, and creates RELEASES + 1 manual
runs of it at once (`kubectl create job --from`): the first is let go at once, the others
wait as suspended Jobs with no pod, and each release lets the next one go. Every release
is one sample: from the Lease's `cronlock.io/released-at` (the releasing sidecar's clock)
to the next run's work starting (its main container connecting to the work tracker on
the host; the node shares the host's clocks). Each sample is broken into its steps with
the times the real parts give: the Lease's MicroTimes (released-at, the claim's
acquireTime), this process's watches of the Lease, the Jobs and the pods (when each
change was seen), containerd's nanosecond times (`crictl inspect`, read while each run
works: sandbox, sidecar, gate, main) and the tracker. Prints the table and writes
`.testenv/bench/queuestart.json`. A benchmark, not a test: docs/PERFORMANCE.md has the
figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import kubernetes

from tests.support import gen
from tests.support.controlplane import own_controlplane
from tests.support.cronjobs import job_from_cronjob
from tests.support.environment import node_and_operator
from tests.support.kube import wait_for
from tests.support.node import BUSYBOX_IMAGE, WorkTracker, follow, overlapping, wall_time
from tests.support.paths import ROOT

CRONJOB = "queued"
LEASE = f"cronlock-{CRONJOB}"
# The done-when of issue 58: a queued run's work starts within this of the release, at p99.
GOAL_S = 2.0
# The steps of one sample, each between two of its moments (seconds of the host's wall
# clock); the first and last moments are the sample's ends.
STEPS = (
    ("released", "let_go", "release -> Job seen let go (operator: watch, GET, patch)"),
    ("let_go", "pod_seen", "let go -> pod seen (Job controller)"),
    ("pod_seen", "bound", "pod seen -> bound (scheduler)"),
    ("bound", "sandbox", "bound -> sandbox created (kubelet, volumes)"),
    ("sandbox", "sidecar", "sandbox -> sidecar started"),
    ("sidecar", "claimed", "sidecar started -> lock claimed (acquireTime)"),
    ("sidecar", "gate", "sidecar started -> gate started"),
    ("gate", "gate_done", "gate started -> gate exited"),
    ("gate_done", "main", "gate exited -> main started (kubelet's PLEG)"),
    ("main", "work", "main started -> work connects"),
    ("released", "work", "release -> work starts (the sample)"),
)


@dataclass
class Seen:
    """Every version of one kind's objects a watch saw, with the wall time it was seen."""

    versions: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, api: kubernetes.client.ApiClient) -> Callable[[str, Any], None]:
        def seen(kind: str, raw: Any) -> None:
            wall = time.time()
            if kind == "DELETED":
                return
            body = api.sanitize_for_serialization(raw)
            with self.lock:
                self.versions.append((wall, body))

        return seen

    def all(self) -> list[tuple[float, dict[str, Any]]]:
        with self.lock:
            return list(self.versions)


def cronjob(tracker: WorkTracker, work: str) -> dict[str, Any]:
    """Busybox as UID 65532 reporting to the tracker, then `work`, under policy: queue."""
    return gen.cronjob(
        CRONJOB,
        *gen.BY_HAND,
        gen.annotated({"cronlock.io/policy": "queue", "cronlock.io/ttl": "19s"}),
        gen.on_the_node(BUSYBOX_IMAGE, tracker.shell_prefix() + work),
    )


def injected(batch: kubernetes.client.BatchV1Api, namespace: str) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        raw = batch.read_namespaced_cron_job(CRONJOB, namespace, _preload_content=False)
        body: dict[str, Any] = json.loads(raw.data)
        spec = body["spec"]["jobTemplate"]["spec"]
        names = [c["name"] for c in spec["template"]["spec"].get("initContainers") or []]
        return body if names[:2] == ["cronlock", "cronlock-gate"] and spec.get("suspend") else None

    return wait_for(ready, 60, f"the operator to inject {CRONJOB} under policy: queue")


def job_name(index: int) -> str:
    return f"q-{index:03d}"


def of_job(pod: dict[str, Any]) -> str:
    labels = pod["metadata"].get("labels") or {}
    return str(labels.get("batch.kubernetes.io/job-name") or labels.get("job-name") or "")


def pod_uid(pods: Seen, job: str) -> str | None:
    return next((pod["metadata"]["uid"] for _, pod in pods.all() if of_job(pod) == job), None)


def pod_of_job(holder: str, job: str) -> bool:
    """A holder identity `<pod>_<uid8>` of a pod of `job` (`<job>-<5 characters>`)."""
    pod = holder.rpartition("_")[0]
    return pod.startswith(job + "-") and len(pod) == len(job) + 6


def moments(
    job: str,
    previous: str,
    leases: list[tuple[float, dict[str, Any]]],
    jobs: list[tuple[float, dict[str, Any]]],
    pods: list[tuple[float, dict[str, Any]]],
    containers: dict[str, dict[str, float]],
    work_started: float | None,
) -> dict[str, float]:
    """The moments of one sample (the release by the previous run's pod, then the run of
    `job`), in seconds of the host's wall clock; NaN where a part was not seen."""
    found: dict[str, float] = dict.fromkeys([name for step in STEPS for name in step[:2]], math.nan)
    for _, lease in leases:
        annotations = lease["metadata"].get("annotations") or {}
        spec = lease.get("spec") or {}
        last = str(annotations.get("cronlock.io/last-holder") or "")
        if (
            math.isnan(found["released"])
            and not spec.get("holderIdentity")
            and pod_of_job(last, previous)
        ):
            found["released"] = wall_time(annotations.get("cronlock.io/released-at")) or math.nan
        holder = str(spec.get("holderIdentity") or "")
        if math.isnan(found["claimed"]) and pod_of_job(holder, job):
            found["claimed"] = wall_time(spec.get("acquireTime")) or math.nan
    for seen, body in jobs:
        if body["metadata"]["name"] == job and body["spec"].get("suspend") is False:
            found["let_go"] = seen
            break
    for seen, pod in pods:
        if of_job(pod) != job:
            continue
        if math.isnan(found["pod_seen"]):
            found["pod_seen"] = seen
        if (pod.get("spec") or {}).get("nodeName"):
            found["bound"] = seen
            break
    found["sandbox"] = containers.get("sandbox", {}).get("created", math.nan)
    found["sidecar"] = containers.get("cronlock", {}).get("started", math.nan)
    found["gate"] = containers.get("cronlock-gate", {}).get("started", math.nan)
    found["gate_done"] = containers.get("cronlock-gate", {}).get("finished", math.nan)
    found["main"] = containers.get("main", {}).get("started", math.nan)
    found["work"] = math.nan if work_started is None else work_started
    return found


def steps(found: dict[str, float]) -> dict[str, float]:
    return {label: found[right] - found[left] for left, right, label in STEPS}


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile, linear between the sorted samples (the inclusive method): with n
    samples, p99 lies between the largest two."""
    ordered = sorted(value for value in values if not math.isnan(value))
    if not ordered:
        return math.nan
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[round(q * 100) - 1]


def summarize(samples: list[dict[str, float]]) -> dict[str, Any]:
    latencies = [sample["release -> work starts (the sample)"] for sample in samples]
    valid = [value for value in latencies if not math.isnan(value)]
    summary: dict[str, Any] = {
        "samples": len(valid),
        "p50_s": quantile(valid, 0.50),
        "p95_s": quantile(valid, 0.95),
        "p99_s": quantile(valid, 0.99),
        "max_s": max(valid) if valid else math.nan,
        "over_goal": sum(1 for value in valid if value > GOAL_S),
        "sorted_s": sorted(round(value, 3) for value in valid),
        "steps": {},
    }
    for _, _, label in STEPS:
        values = [v for sample in samples if not math.isnan(v := sample[label])]
        summary["steps"][label] = {
            "median_s": statistics.median(values) if values else math.nan,
            "p95_s": quantile(values, 0.95),
            "max_s": max(values) if values else math.nan,
        }
    return summary


def table(summary: dict[str, Any], gates: str) -> str:
    met = "met" if summary["p99_s"] <= GOAL_S else "NOT met"
    lines = [
        f"kubelet feature gates: {gates or '(defaults)'}",
        f"{summary['samples']} releases, release -> next queued run's work starts:",
        f"  p50 {summary['p50_s']:.3f}s  p95 {summary['p95_s']:.3f}s  "
        f"p99 {summary['p99_s']:.3f}s  max {summary['max_s']:.3f}s  "
        f"over {GOAL_S:.0f}s: {summary['over_goal']}  (goal p99 <= {GOAL_S:.0f}s: {met})",
        "  sorted: " + ", ".join(f"{value:.2f}" for value in summary["sorted_s"]),
        f"where it goes (s): {'median':>8} {'p95':>8} {'max':>8}",
    ]
    for label, row in summary["steps"].items():
        lines.append(f"  {label:58} {row['median_s']:8.3f} {row['p95_s']:8.3f} {row['max_s']:8.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks queuestart", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--releases", type=int, default=40, help="samples (default: 40)")
    parser.add_argument(
        "--work", default="sleep 2", help="each run's work, after it reports (default: sleep 2)"
    )
    parser.add_argument("--env-dir", type=Path, default=ROOT / ".testenv" / "bench-queuestart")
    parser.add_argument("--keep-controlplane", action="store_true")
    parser.add_argument(
        "--kubelet-feature-gates",
        default="",
        metavar="NAME=true,...",
        help="the node's kubelet feature gates, e.g. EventedPLEG=true (default: none)",
    )
    args = parser.parse_args(argv)
    if args.releases < 1:
        parser.error("--releases: at least 1")
    os.environ["CRONLOCK_KUBELET_FEATURE_GATES"] = args.kubelet_feature_gates
    env_dir = args.env_dir.resolve()
    namespace = f"queuestart-{secrets.token_hex(3)}"
    runs = [job_name(index) for index in range(args.releases + 1)]
    seen = {kind: Seen() for kind in ("leases", "jobs", "pods")}
    stopped = threading.Event()
    load_before = os.getloadavg()
    with (
        own_controlplane(env_dir, args.keep_controlplane) as cluster,
        node_and_operator(cluster, env_dir) as around,
    ):
        api = around.api
        batch = kubernetes.client.BatchV1Api(api)
        core = kubernetes.client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": namespace}})
        lists = {
            "leases": kubernetes.client.CoordinationV1Api(api).list_namespaced_lease,
            "jobs": batch.list_namespaced_job,
            "pods": core.list_namespaced_pod,
        }
        for kind, list_objects in lists.items():
            threading.Thread(
                target=follow,
                args=(list_objects, namespace, stopped, seen[kind].add(api)),
                daemon=True,
            ).start()
        batch.create_namespaced_cron_job(namespace, cronjob(around.tracker, args.work))
        template = injected(batch, namespace)
        for job in runs:
            batch.create_namespaced_job(namespace, job_from_cronjob(template, job))
        offset = time.time() - time.monotonic()
        node = around.nodes[0]
        containers = {}
        for job in runs:
            wait_for(partial(around.tracker.works, f"{job}-"), 120, f"the work of {job} to start")
            # Read at once, while its work runs: the kubelet's garbage collection removes
            # the containers of finished pods (a run read at the end had lost 30 of 40).
            uid = wait_for(partial(pod_uid, seen["pods"], job), 30, f"the pod of {job}")
            containers[job] = node.container_times(uid)
            print(f"{job}: work started", flush=True)
        last = around.tracker.works(f"{runs[-1]}-")[0]
        wait_for(lambda: last.stopped is not None, 60, "the last work to end")
        stopped.set()
        works = {job: around.tracker.works(f"{job}-")[0] for job in runs}
        pods = seen["pods"].all()
        overlaps = overlapping(list(works.values()))
        order = [w.pod.rsplit("-", 1)[0] for w in sorted(works.values(), key=lambda w: w.started)]
        samples = []
        found_all = []
        for previous, job in itertools.pairwise(runs):
            found = moments(
                job,
                previous,
                seen["leases"].all(),
                seen["jobs"].all(),
                pods,
                containers.get(job, {}),
                works[job].started + offset,
            )
            found_all.append({"job": job, **found})
            samples.append(steps(found))
    summary = summarize(samples)
    # The machine is shared: its load says how far other work moved the figures.
    summary["load_before"] = load_before
    summary["load_after"] = os.getloadavg()
    summary["overlaps"] = len(overlaps)
    summary["in_creation_order"] = order == runs
    print(table(summary, args.kubelet_feature_gates))
    print(f"load average (1, 5, 15 min) before: {load_before}, after: {summary['load_after']}")
    print(f"overlapping works: {len(overlaps)}; worked in creation order: {order == runs}")
    out = ROOT / ".testenv" / "bench" / "queuestart.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "kubelet_feature_gates": args.kubelet_feature_gates,
                "summary": summary,
                "moments": found_all,
            },
            indent=2,
            default=str,
        )
    )
    print(f"written to {out}")
    return 0 if not overlaps and order == runs else 1


if __name__ == "__main__":
    sys.exit(main())
