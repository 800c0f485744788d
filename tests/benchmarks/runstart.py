"""What a guarded run costs at its start, on the real node: `Job created -> its work starts`,
the same pod guarded and unguarded, in interleaved pairs.

    flock /tmp/cronlock-node.lock .venv/bin/python -m tests.benchmarks runstart [--pairs 20]

Starts its own control plane, the real node (kubelet, containerd, runc) and the operator
(tests/support/environment.py's `node_and_operator`), makes two CronJobs with the same main
container (busybox `sh`, UID 65532), one annotated `cronlock.io/enabled: "true"` and
injected, and creates a Job from each in turn (`kubectl create job --from`), alternating
which goes first. A run's work starts when its main container connects to the work
tracker on the host (tests/support/node.py), the first thing its script does. Each run's
containers are read back from containerd (`crictl inspect`: nanosecond create, start and
finish times, where the pod's status has whole seconds) to say where the time goes:
scheduling and the kubelet until the sandbox, the sandbox, the sidecar's start, the gate
(start until its exit: one Python start and the wait for the Lease), the main container's
start. Prints the table and writes `.testenv/bench/runstart.json`. A benchmark, not a test:
docs/PERFORMANCE.md has the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kubernetes

from tests.support import gen
from tests.support.controlplane import own_controlplane
from tests.support.cronjobs import job_from_cronjob
from tests.support.environment import node_and_operator
from tests.support.kube import wait_for
from tests.support.node import BUSYBOX_IMAGE, RealNode, WorkTracker
from tests.support.paths import ROOT

KINDS = ("plain", "guarded")
# The stages of a guarded run, between containerd's timestamps (each a difference of two
# times on the host's wall clock, which the node shares).
STAGES = {
    "guarded": (
        ("sandbox", "created", "cronlock", "started", "sandbox -> sidecar started"),
        ("cronlock", "started", "cronlock-gate", "started", "sidecar -> gate started"),
        ("cronlock-gate", "started", "cronlock-gate", "finished", "gate ran (Lease held)"),
        ("cronlock-gate", "finished", "main", "started", "gate ended -> main started"),
    ),
    "plain": (("sandbox", "created", "main", "started", "sandbox -> main started"),),
}


def cronjob(
    name: str, tracker: WorkTracker, guarded: bool, work: str = "sleep 0.5"
) -> dict[str, Any]:
    """Busybox as UID 65532 reporting to the tracker, then `work`; annotated if `guarded`."""
    return gen.cronjob(
        name,
        *([] if guarded else [gen.not_opted_in()]),
        *gen.BY_HAND,
        gen.on_the_node(BUSYBOX_IMAGE, tracker.shell_prefix() + work),
    )


def injected(batch: kubernetes.client.BatchV1Api, namespace: str, name: str) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        raw = batch.read_namespaced_cron_job(name, namespace, _preload_content=False)
        body: dict[str, Any] = json.loads(raw.data)
        spec = body["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        names = [c["name"] for c in spec.get("initContainers") or []]
        return body if names[:2] == ["cronlock", "cronlock-gate"] else None

    return wait_for(ready, 60, f"the operator to inject {name}")


def one_run(
    api: kubernetes.client.ApiClient,
    node: RealNode,
    tracker: WorkTracker,
    namespace: str,
    template: dict[str, Any],
    job: str,
) -> dict[str, Any]:
    """Create the Job, time its work's start, wait for its end, read its containers' times."""
    batch = kubernetes.client.BatchV1Api(api)
    core = kubernetes.client.CoreV1Api(api)
    created_wall, created = time.time(), time.monotonic()
    batch.create_namespaced_job(namespace, job_from_cronjob(template, job))
    work = wait_for(
        lambda: next(iter(tracker.works(f"{job}-")), None), 60, f"the work of {job} to start"
    )
    wait_for(lambda: work.stopped is not None, 60, f"the work of {job} to end")
    pod = core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items[0]
    wait_for(
        lambda: batch.read_namespaced_job(job, namespace).status.completion_time is not None,
        60,
        f"{job} to complete",
    )
    times = node.container_times(pod.metadata.uid)
    return {
        "job": job,
        "start_s": work.started - created,
        "created_wall": created_wall,
        "containers": times,
    }


def stages(run: dict[str, Any], kind: str) -> dict[str, float]:
    times = run["containers"]
    found = {
        "created -> sandbox": times.get("sandbox", {}).get("created", math.nan)
        - run["created_wall"]
    }
    for left, left_at, right, right_at, label in STAGES[kind]:
        found[label] = times.get(right, {}).get(right_at, math.nan) - times.get(left, {}).get(
            left_at, math.nan
        )
    return found


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(value for value in values if not math.isnan(value))
    if not ordered:
        return math.nan
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[round(q * 100) - 1]


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    pairs = list(zip(runs["plain"], runs["guarded"], strict=True))
    extra = [guarded["start_s"] - plain["start_s"] for plain, guarded in pairs]
    summary: dict[str, Any] = {
        "pairs": len(pairs),
        "extra_median_s": statistics.median(extra),
        "extra_p95_s": quantile(extra, 0.95),
        "extra_s": extra,
    }
    for kind in KINDS:
        starts = [run["start_s"] for run in runs[kind]]
        summary[kind] = {
            "start_median_s": statistics.median(starts),
            "start_p95_s": quantile(starts, 0.95),
            "stages_median_s": {
                label: statistics.median(
                    [v for run in runs[kind] if not math.isnan(v := stages(run, kind)[label])]
                    or [math.nan]
                )
                for label in stages(runs[kind][0], kind)
            },
        }
    return summary


def table(summary: dict[str, Any]) -> str:
    lines = [
        f"{summary['pairs']} interleaved pairs, Job created -> its work starts",
        f"{'':28} {'median':>8} {'p95':>8}",
    ]
    for kind in KINDS:
        row = summary[kind]
        lines.append(f"{kind:28} {row['start_median_s']:8.3f} {row['start_p95_s']:8.3f}")
    lines.append(
        f"{'guarded - plain (per pair)':28} {summary['extra_median_s']:8.3f} "
        f"{summary['extra_p95_s']:8.3f}"
    )
    for kind in KINDS:
        lines.append(f"where {kind} runs spend it (medians, s):")
        for label, value in summary[kind]["stages_median_s"].items():
            lines.append(f"  {label:34} {value:6.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks runstart", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--env-dir", type=Path, default=ROOT / ".testenv" / "bench-runstart")
    parser.add_argument("--keep-controlplane", action="store_true")
    parser.add_argument(
        "--kubelet-feature-gates",
        default="",
        metavar="NAME=true,...",
        help="the node's kubelet feature gates, e.g. EventedPLEG=true (default: none)",
    )
    args = parser.parse_args(argv)
    os.environ["CRONLOCK_KUBELET_FEATURE_GATES"] = args.kubelet_feature_gates
    env_dir = args.env_dir.resolve()
    namespace = f"runstart-{secrets.token_hex(3)}"
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    with (
        own_controlplane(env_dir, args.keep_controlplane) as cluster,
        node_and_operator(cluster, env_dir) as around,
    ):
        api = around.api
        batch = kubernetes.client.BatchV1Api(api)
        kubernetes.client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
        templates = {}
        for kind in KINDS:
            batch.create_namespaced_cron_job(
                namespace, cronjob(kind, around.tracker, guarded=kind == "guarded")
            )
        templates["guarded"] = injected(batch, namespace, "guarded")
        templates["plain"] = json.loads(
            batch.read_namespaced_cron_job("plain", namespace, _preload_content=False).data
        )
        # One of each first, unmeasured: the images' first start warms the page cache.
        for kind in KINDS:
            one_run(api, around.nodes[0], around.tracker, namespace, templates[kind], f"w-{kind}")
        for pair in range(args.pairs):
            order = KINDS if pair % 2 == 0 else KINDS[::-1]
            for kind in order:
                run = one_run(
                    api,
                    around.nodes[0],
                    around.tracker,
                    namespace,
                    templates[kind],
                    f"{kind}-{pair}",
                )
                runs[kind].append(run)
                print(f"{run['job']}: work started {run['start_s']:.3f}s after the Job", flush=True)
    summary = summarize(runs)
    print(table(summary))
    out = ROOT / ".testenv" / "bench" / "runstart.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"kubelet_feature_gates": args.kubelet_feature_gates, "summary": summary, "runs": runs},
            indent=2,
            default=str,
        )
    )
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
