"""Load: hundreds of guarded runs holding Leases at once, renewing, on the local control plane.

    .venv/bin/python -m tests.benchmarks.load [--leases 100] [--ttl 15s] [--renew 5s]
        [--window 60] [--keep-controlplane]

Starts N `cronlock-sidecar run --lease NS/load-I -- sleep ...` processes (each is `run` plus
its watchdog plus `sleep`), waits until all hold their Lease, then for `--window` seconds
counts renewals (from each sidecar's debug log), Lease writes (a watch on the namespace:
every resourceVersion change is one write), CPU time and memory. Writes the figures to
`.testenv/bench/load.json`. A benchmark, not a test; docs/RELIABILITY.md has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kubernetes
import urllib3

from tests.support.controlplane import own_controlplane
from tests.support.paths import ROOT, SIDECAR
from tests.support.processes import children

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def parse_seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r}: expected e.g. 500ms, 5s, 1m")
    return float(match.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[match.group(2)]


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def memory(pid: int) -> dict[str, float]:
    """VmRSS and Pss in MiB (Pss divides shared pages among the processes mapping them)."""
    figures: dict[str, float] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                figures["rss"] = int(line.split()[1]) / 1024
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                figures["pss"] = int(line.split()[1]) / 1024
    except OSError:
        return {}
    return figures


class WriteCounter:
    """Counts MODIFIED events per Lease in one namespace through a watch."""

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str) -> None:
        self.leases = kubernetes.client.CoordinationV1Api(api)
        self.namespace = namespace
        self.writes: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._watch = kubernetes.watch.Watch()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._watch.stop()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        version = self.leases.list_namespaced_lease(self.namespace).metadata.resource_version
        while not self._stop.is_set():
            try:
                for event in self._watch.stream(
                    self.leases.list_namespaced_lease,
                    self.namespace,
                    resource_version=version,
                    timeout_seconds=30,
                ):
                    version = event["object"].metadata.resource_version
                    if event["type"] == "MODIFIED":
                        self.writes.append((time.monotonic(), event["object"].metadata.name))
                    if self._stop.is_set():
                        return
            except kubernetes.client.ApiException as error:
                if error.status != 410:
                    raise
                version = self.leases.list_namespaced_lease(
                    self.namespace
                ).metadata.resource_version
            except urllib3.exceptions.HTTPError:
                if self._stop.is_set():
                    return
                raise

    def between(self, start: float, end: float) -> Counter[str]:
        return Counter(name for when, name in self.writes if start <= when < end)


def launch(
    count: int,
    namespace: str,
    ttl: float,
    renew: float,
    env: dict[str, str],
    logs: Path,
    per_second: float,
) -> list[subprocess.Popen[bytes]]:
    processes = []
    for index in range(count):
        argv = [
            str(SIDECAR), "run", "--lease", f"{namespace}/load-{index}",
            "--ttl", f"{ttl:g}s", "--renew", f"{renew:g}s", "--log-level", "debug",
            "--identity", f"load-{index}", "--", "sleep", "3600",
        ]  # fmt: skip
        with open(logs / f"load-{index}.log", "wb") as log:
            processes.append(
                subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    start_new_session=True,
                )
            )
        # A start costs ~0.1 CPU-second: 20 a second fill both cores of the reference VM.
        time.sleep(1 / per_second)
    return processes


def count_lines(logs: Path, pattern: str) -> int:
    return sum(
        len(re.findall(pattern, path.read_text(errors="replace"))) for path in logs.glob("*.log")
    )


def run(args: argparse.Namespace, env: dict[str, str], kubeconfig: Path) -> dict[str, Any]:
    api = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
    core = kubernetes.client.CoreV1Api(api)
    namespace = f"load-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": namespace}})
    logs = ROOT / ".testenv" / "bench" / "load-logs" / namespace
    logs.mkdir(parents=True, exist_ok=True)
    counter = WriteCounter(api, namespace)
    counter.start()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        started = time.monotonic()
        processes = launch(
            args.leases, namespace, args.ttl, args.renew, env, logs, args.starts_per_second
        )
        deadline = time.monotonic() + 120
        while count_lines(logs, r" acquired by ") < args.leases:
            if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
                raise RuntimeError(
                    f"only {count_lines(logs, r' acquired by ')} of {args.leases} acquired"
                )
            time.sleep(0.5)
        all_held = time.monotonic() - started
        time.sleep(args.renew)  # settle: every sidecar past its first renewal
        pids = [p.pid for p in processes]
        watchdogs = [
            child
            for pid in pids
            for child in children(pid)
            if not Path(f"/proc/{child}/cmdline").read_bytes().startswith(b"sleep")
        ]
        apiserver = int((args.env_dir / "kube-apiserver.pid").read_text())
        etcd = int((args.env_dir / "etcd.pid").read_text())
        cpu_before = {pid: cpu_seconds(pid) for pid in [*pids, *watchdogs, apiserver, etcd]}
        renewed_before = count_lines(logs, r" renewed by ")
        failed_before = count_lines(logs, r" renew failed ")
        window_start = time.monotonic()
        time.sleep(args.window)
        window_end = time.monotonic()
        renewed = count_lines(logs, r" renewed by ") - renewed_before
        failed = count_lines(logs, r" renew failed ") - failed_before
        cpu = {pid: cpu_seconds(pid) - before for pid, before in cpu_before.items()}
        run_memory = [memory(pid) for pid in pids]
        watchdog_memory = [memory(pid) for pid in watchdogs]
        writes = counter.between(window_start, window_end)
        lost = count_lines(logs, r" lost ")
        alive = sum(p.poll() is None for p in processes)
        expected_per_lease = args.window / args.renew
        per_lease = [writes.get(f"load-{index}", 0) for index in range(args.leases)]

        def mib(values: list[float]) -> dict[str, float]:
            return {
                "sum": round(sum(values), 1),
                "median": round(statistics.median(values), 1),
                "max": round(max(values), 1),
            }

        return {
            "leases": args.leases,
            "ttl_s": args.ttl,
            "renew_s": args.renew,
            "window_s": args.window,
            "starts_per_second": args.starts_per_second,
            "seconds_until_all_held": round(all_held, 1),
            "renewals": renewed,
            "renew_failures": failed,
            "renew_success_rate": round(renewed / max(1, renewed + failed), 4),
            "leases_lost": lost,
            "runs_alive_at_end": alive,
            "lease_writes": sum(per_lease),
            "writes_per_lease_per_renew_period": round(
                statistics.mean(per_lease) / expected_per_lease, 3
            ),
            "writes_per_lease_min_max": [min(per_lease), max(per_lease)],
            "api_writes_per_second": round(sum(per_lease) / args.window, 1),
            "run_rss_mib": mib([m.get("rss", 0.0) for m in run_memory]),
            "run_pss_mib": mib([m.get("pss", 0.0) for m in run_memory]),
            "watchdog_rss_mib": mib([m.get("rss", 0.0) for m in watchdog_memory]),
            "watchdog_pss_mib": mib([m.get("pss", 0.0) for m in watchdog_memory]),
            "sidecar_cpu_percent_of_one_core": round(
                100 * sum(cpu[pid] for pid in [*pids, *watchdogs]) / args.window, 1
            ),
            "kube_apiserver_cpu_percent": round(100 * cpu[apiserver] / args.window, 1),
            "etcd_cpu_percent": round(100 * cpu[etcd] / args.window, 1),
            "machine": {"nproc": os.cpu_count(), "loadavg": os.getloadavg()},
        }
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        counter.stop()
        core.delete_namespace(namespace)
        api.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.load", description=__doc__)
    parser.add_argument("--leases", type=int, default=100)
    parser.add_argument("--ttl", type=parse_seconds, default=15.0)
    parser.add_argument("--renew", type=parse_seconds, default=5.0)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--starts-per-second", type=float, default=10.0)
    parser.add_argument("--env-dir", type=Path, default=ROOT / ".testenv" / "bench-load")
    parser.add_argument("--keep-controlplane", action="store_true")
    args = parser.parse_args(argv)
    with own_controlplane(args.env_dir, args.keep_controlplane) as cluster:
        results = run(args, cluster.env, cluster.kubeconfig)
    text = json.dumps(results, indent=2)
    print(text)
    output = ROOT / ".testenv" / "bench" / "load.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text + "\n")
    ok = results["renew_failures"] == 0 and results["leases_lost"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
