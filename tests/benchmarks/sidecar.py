"""Sidecar costs next to kubectl and bare Python: whole runs, release latency, memory, writes."""

from __future__ import annotations

import argparse
import compileall
import json
import secrets
import shlex
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes

from tests.benchmarks import BENCH_DIR, controlplane, machine, summary, table
from tests.support.controlplane import ControlPlane
from tests.support.paths import ROOT
from tests.support.ports import free_port

VENV_BIN = ROOT / ".venv" / "bin"
SIDECAR = str(VENV_BIN / "cronlock-sidecar")
PYTHON = str(VENV_BIN / "python")
LEASE = "cronlock-bench"
# Memory baselines: each prints "ready" once its imports are done, then sleeps.
BARE_PYTHON = "import time; print('ready', flush=True); time.sleep(30)"
KUBERNETES_CLIENT = "import kubernetes.client, time; print('ready', flush=True); time.sleep(30)"
RENEW_PERIODS = 10


@dataclass(frozen=True)
class Change:
    """One version of the Lease as a watch delivered it."""

    arrived: float
    holder: str
    resource_version: str


class LeaseWatch:
    """Every version of one Lease as a watch sees it, with its monotonic arrival time."""

    def __init__(self, plane: ControlPlane, namespace: str, name: str) -> None:
        self.client = kubernetes.config.new_client_from_config(config_file=str(plane.kubeconfig))
        self.namespace = namespace
        self.name = name
        self.changes: list[Change] = []
        self.errors: list[str] = []
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lease-watch", daemon=True)

    def __enter__(self) -> LeaseWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.client.close()

    def _loop(self) -> None:
        leases = kubernetes.client.CoordinationV1Api(self.client)
        version: str | None = None
        while not self._stop.is_set():
            try:
                version = self._follow(leases, version)
            except (kubernetes.client.ApiException, OSError, ValueError, KeyError) as error:
                # An expired resourceVersion or a dropped connection: list again.
                self.errors.append(repr(error))
                version = None
                time.sleep(0.1)

    def _follow(self, leases: Any, version: str | None) -> str | None:
        """One watch request (a few seconds); returns the last resourceVersion seen."""
        watch = kubernetes.watch.Watch()
        extra = {"resource_version": version} if version else {}
        for event in watch.stream(
            leases.list_namespaced_lease,
            self.namespace,
            field_selector=f"metadata.name={self.name}",
            timeout_seconds=5,
            **extra,
        ):
            arrived = time.monotonic()
            raw = event["raw_object"]
            if event["type"] not in {"ADDED", "MODIFIED", "DELETED"}:
                raise ValueError(f"watch event {event['type']}: {raw}")
            version = str(raw["metadata"]["resourceVersion"])
            holder = (raw.get("spec") or {}).get("holderIdentity") or ""
            with self._changed:
                if not self.changes or self.changes[-1].resource_version != version:
                    self.changes.append(Change(arrived, holder, version))
                self._changed.notify_all()
            if self._stop.is_set():
                watch.stop()
        return version

    def mark(self) -> int:
        with self._changed:
            return len(self.changes)

    def wait(self, matches: Callable[[Change], bool], since: int, timeout: float = 30) -> Change:
        """The first change at index >= `since` that matches."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for change in self.changes[since:]:
                    if matches(change):
                        return change
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"no matching change of lease {self.name} in {timeout}s "
                        f"(last {self.changes[-3:]}, watch errors {self.errors[-3:]})"
                    )
                self._changed.wait(left)

    def between(self, start: float, end: float) -> list[Change]:
        with self._changed:
            return [change for change in self.changes if start <= change.arrived < end]


class Sidecars:
    """Starts `run` and `hold` processes on the benchmark's Lease."""

    def __init__(self, plane: ControlPlane, namespace: str, workdir: Path) -> None:
        self.plane = plane
        self.lease = f"{namespace}/{LEASE}"
        self.workdir = workdir

    def run(
        self, identity: str, *flags: str, cmd: tuple[str, ...] = ("sleep", "60")
    ) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [SIDECAR, "run", "--lease", self.lease, "--identity", identity, *flags, "--", *cmd],
            env=self.plane.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def hold(self, pod: str, *flags: str) -> tuple[subprocess.Popen[bytes], str, int]:
        """The process, its identity and its HTTP port."""
        uid = secrets.token_hex(8)
        port = free_port()
        run_dir = self.workdir / pod
        process = subprocess.Popen(
            [
                SIDECAR,
                "hold",
                "--lease",
                self.lease,
                "--run-dir",
                str(run_dir),
                "--port",
                str(port),
                *flags,
            ],
            env={**self.plane.env, "CRONLOCK_POD_NAME": pod, "CRONLOCK_POD_UID": uid},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return process, f"{pod}_{uid[:8]}", port


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# --- 1. a whole run next to one kubectl request ---------------------------------------------
def whole_run(plane: ControlPlane, namespace: str, repeat: int) -> dict[str, Any]:
    commands = {
        "cronlock-sidecar run -- true": [
            SIDECAR,
            "run",
            "--lease",
            f"{namespace}/{LEASE}",
            "--ttl",
            "10s",
            "--",
            "true",
        ],
        "kubectl get lease": ["kubectl", "get", "lease", LEASE, "-n", namespace],
        "python -c pass": [PYTHON, "-c", "pass"],
        "python -c 'import kubernetes.client'": [PYTHON, "-c", "import kubernetes.client"],
    }
    timings: dict[str, list[float]] = {name: [] for name in commands}
    order = list(commands)
    for index in range(repeat + 2):
        # Rotate the order so no command always runs right after the same other one.
        shift = index % len(order)
        for name in order[shift:] + order[:shift]:
            started = time.monotonic()
            subprocess.run(commands[name], env=plane.env, capture_output=True, check=True)
            if index >= 2:  # the first two rounds warm caches
                timings[name].append(time.monotonic() - started)
    results = {name: summary(values) for name, values in timings.items()}
    ratio = (
        results["cronlock-sidecar run -- true"]["median"] / results["kubectl get lease"]["median"]
    )
    return {"seconds": results, "ratio_run_to_kubectl_median": ratio, "goal_ratio": 2.0}


# --- 2. release latency ---------------------------------------------------------------------
def release_latency(sidecars: Sidecars, watch: LeaseWatch, repeat: int) -> dict[str, Any]:
    latencies: dict[str, list[float]] = {"run": [], "hold": []}
    exits: dict[str, list[float]] = {"run": [], "hold": []}
    for index in range(repeat):
        for kind in ("run", "hold"):
            since = watch.mark()
            if kind == "run":
                identity = f"bench-run-{index}"
                process = sidecars.run(identity, "--ttl", "30s")
            else:
                process, identity, _ = sidecars.hold(f"bench-hold-{index}", "--ttl", "30s")
            watch.wait(lambda change, who=identity: change.holder == who, since)
            time.sleep(0.3)  # steady state: CMD started, decision written
            since = watch.mark()
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            released = watch.wait(lambda change: change.holder == "", since)
            process.wait(timeout=10)
            latencies[kind].append(released.arrived - signalled)
            exits[kind].append(time.monotonic() - signalled)
    return {
        "sigterm_to_holder_empty_seconds": {
            kind: summary(values) for kind, values in latencies.items()
        },
        "sigterm_to_exit_seconds": {kind: summary(values) for kind, values in exits.items()},
        "goal_median_seconds": 0.1,
    }


# --- 3. resident memory -----------------------------------------------------------------------
def _memory(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM from /proc/PID/status and Pss from smaps_rollup, in MiB."""
    figures: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in {"VmRSS", "VmHWM"}:
            figures[key] = int(value.split()[0]) / 1024
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            figures["Pss"] = int(line.split()[1]) / 1024
    return figures


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(child) for child in text.split()]


def _python_baseline(plane: ControlPlane, code: str) -> dict[str, float]:
    process = subprocess.Popen(
        [PYTHON, "-c", code], env=plane.env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        process.stdout.readline()
        time.sleep(0.2)
        return _memory(process.pid)
    finally:
        process.kill()
        process.wait()


def memory(
    plane: ControlPlane, sidecars: Sidecars, watch: LeaseWatch, samples: int
) -> dict[str, Any]:
    measured: dict[str, list[dict[str, float]]] = {
        "python sleep (bare interpreter)": [],
        "python import kubernetes.client": [],
        "cronlock-sidecar hold (holding)": [],
        "cronlock-sidecar run (holding)": [],
        "cronlock-sidecar run: watchdog": [],
    }
    for index in range(samples):
        measured["python sleep (bare interpreter)"].append(_python_baseline(plane, BARE_PYTHON))
        measured["python import kubernetes.client"].append(
            _python_baseline(plane, KUBERNETES_CLIENT)
        )

        since = watch.mark()
        process, identity, port = sidecars.hold(
            f"bench-memory-{index}", "--ttl", "3s", "--renew", "1s"
        )
        watch.wait(lambda change, who=identity: change.holder == who, since)
        time.sleep(2.5)  # a couple of renewals
        for path in ("/held", "/metrics", "/healthz"):  # what the kubelet and Prometheus call
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
                answer.read()
        time.sleep(0.2)
        measured["cronlock-sidecar hold (holding)"].append(_memory(process.pid))
        _stop(process)

        since = watch.mark()
        identity = f"bench-memory-run-{index}"
        process = sidecars.run(identity, "--ttl", "3s", "--renew", "1s")
        watch.wait(lambda change, who=identity: change.holder == who, since)
        time.sleep(2.5)
        measured["cronlock-sidecar run (holding)"].append(_memory(process.pid))
        watchdog = [
            child
            for child in _children(process.pid)
            if "python" in Path(f"/proc/{child}/exe").resolve().name
        ]
        if watchdog:
            measured["cronlock-sidecar run: watchdog"].append(_memory(watchdog[0]))
        _stop(process)
    return {
        "mib": {
            name: {
                key: summary([sample[key] for sample in values])["median"]
                for key in ("VmRSS", "VmHWM", "Pss")
            }
            for name, values in measured.items()
            if values
        },
        "samples": samples,
        "goal_hold_rss_mib": 30,
    }


# --- 4. API writes --------------------------------------------------------------------------
def writes(sidecars: Sidecars, watch: LeaseWatch) -> dict[str, Any]:
    renew = 1.0
    window = RENEW_PERIODS * renew
    since = watch.mark()
    holder, identity, _ = sidecars.hold("bench-writes-1", "--ttl", "3s", "--renew", f"{renew:g}s")
    acquired = watch.wait(lambda change: change.holder == identity, since)
    start = acquired.arrived + renew / 2
    time.sleep(max(0.0, start + window - time.monotonic()) + 0.2)
    while_holding = len(watch.between(start, start + window))

    # A second sidecar that decided "skip" stays up idle; the first one then releases.
    idle, _, _ = sidecars.hold("bench-writes-2", "--ttl", "3s", "--renew", f"{renew:g}s")
    time.sleep(2.0)
    since = watch.mark()
    holder.send_signal(signal.SIGTERM)
    released = watch.wait(lambda change: change.holder == "", since)
    holder.wait(timeout=10)
    idle_start = released.arrived + 0.05
    time.sleep(window)
    _stop(idle)
    time.sleep(1.0)
    while_idle = len(watch.between(idle_start, time.monotonic()))

    since = watch.mark()
    run = sidecars.run("bench-writes-run", "--ttl", "3s", "--renew", f"{renew:g}s")
    acquired = watch.wait(lambda change: change.holder == "bench-writes-run", since)
    start = acquired.arrived + renew / 2
    time.sleep(max(0.0, start + window - time.monotonic()) + 0.2)
    run_holding = len(watch.between(start, start + window))
    _stop(run)
    return {
        "renew_seconds": renew,
        "renew_periods": RENEW_PERIODS,
        "hold_writes_while_holding": while_holding,
        "run_writes_while_holding": run_holding,
        "writes_while_idle_after_release": while_idle,
        "expected_while_holding": RENEW_PERIODS,
        "expected_while_idle": 0,
    }


# --- report ------------------------------------------------------------------------------------
def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def report(results: dict[str, Any]) -> str:
    rows: list[list[str]] = []
    whole = results["whole_run"]
    for name, figures in whole["seconds"].items():
        rows.append([name, _ms(figures["median"]), _ms(figures["p90"]), str(figures["n"]), ""])
    rows.append(
        [
            "ratio run / kubectl (medians)",
            f"{whole['ratio_run_to_kubectl_median']:.2f}x",
            "",
            "",
            f"<= {whole['goal_ratio']:g}x",
        ]
    )
    release = results["release_latency"]
    for kind, figures in release["sigterm_to_holder_empty_seconds"].items():
        rows.append(
            [
                f"release: SIGTERM to {kind} -> HOLDER empty (watch)",
                _ms(figures["median"]),
                _ms(figures["p90"]),
                str(figures["n"]),
                "<= 100 ms median",
            ]
        )
    first = table(["measurement", "median", "p90", "n", "goal"], rows)

    memory_rows = [
        [
            name,
            f"{values['VmRSS']:.1f}",
            f"{values['VmHWM']:.1f}",
            f"{values['Pss']:.1f}",
            "<= 30 MiB" if name.startswith("cronlock-sidecar hold") else "",
        ]
        for name, values in results["memory"]["mib"].items()
    ]
    second = table(
        ["process (median of samples)", "VmRSS MiB", "VmHWM MiB", "Pss MiB", "goal"], memory_rows
    )

    counted = results["writes"]
    periods = counted["renew_periods"]
    write_rows = [
        [
            "hold, holding",
            f"{periods} x {counted['renew_seconds']:g}s",
            str(counted["hold_writes_while_holding"]),
            str(periods),
        ],
        [
            "run, holding",
            f"{periods} x {counted['renew_seconds']:g}s",
            str(counted["run_writes_while_holding"]),
            str(periods),
        ],
        [
            "idle after release (skipped hold still up)",
            f"{periods} x {counted['renew_seconds']:g}s",
            str(counted["writes_while_idle_after_release"]),
            "0",
        ],
    ]
    third = table(
        ["Lease writes (resourceVersion changes)", "window", "counted", "expected"], write_rows
    )
    return f"{first}\n\n{second}\n\n{third}"


def run(plane: ControlPlane, repeat: int) -> dict[str, Any]:
    namespace = f"bench-sidecar-{secrets.token_hex(3)}"
    plane.kubectl("create", "namespace", namespace)
    results: dict[str, Any] = {"namespace": namespace}
    try:
        with (
            tempfile.TemporaryDirectory(prefix="cronlock-bench-") as workdir,
            LeaseWatch(plane, namespace, LEASE) as watch,
        ):
            sidecars = Sidecars(plane, namespace, Path(workdir))
            print("whole run vs kubectl ...", flush=True)
            results["whole_run"] = whole_run(plane, namespace, repeat)
            print("release latency ...", flush=True)
            results["release_latency"] = release_latency(sidecars, watch, repeat)
            print("memory ...", flush=True)
            results["memory"] = memory(plane, sidecars, watch, samples=3)
            print("API writes ...", flush=True)
            results["writes"] = writes(sidecars, watch)
            results["watch_errors"] = list(watch.errors)
    finally:
        plane.kubectl("delete", "namespace", namespace, "--wait=false")
    print(report(results), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks sidecar", description=__doc__)
    parser.add_argument("--repeat", type=int, default=20, help="repetitions per timing (20)")
    parser.add_argument(
        "--output", type=Path, default=BENCH_DIR, help=f"JSON and control plane files ({BENCH_DIR})"
    )
    parser.add_argument(
        "--keep-controlplane", action="store_true", help="leave the control plane running"
    )
    args = parser.parse_args(argv)
    if args.repeat < 2:
        parser.error("--repeat: at least 2, so that a p90 means something")
    command = shlex.join(["python", "-m", "tests.benchmarks", "sidecar", *(argv or [])])
    args.output.mkdir(parents=True, exist_ok=True)
    # As in the image, where pip compiled them: with PYTHONDONTWRITEBYTECODE set, an edited
    # module would otherwise be compiled again by every process the benchmark starts.
    compileall.compile_dir(ROOT / "sidecar" / "src", quiet=1)
    with controlplane(args.output, keep=args.keep_controlplane) as plane:
        results = run(plane, args.repeat)
    document = {
        "benchmark": "sidecar",
        "command": command,
        "repeat": args.repeat,
        "machine": machine(),
        "results": results,
    }
    path = args.output / "sidecar.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {path}", flush=True)
    return 0
