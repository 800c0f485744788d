"""Lease requests per held lock, and the hold's and gate's RSS and CPU, next to client-go.

N locks are held for D seconds by `cronlock-sidecar hold`, started with the environment
the operator injects (its default ttl and renew), then the same N by client-go's leader
election with a LeaseLock at the same timings (tests/controlplane/go/leaderelect), phases
interleaved. The API server's own `apiserver_request_total{resource="leases"}` is read
before and after each phase; its background (its identity Lease, renewed every 10s) is
measured while nothing runs and taken off. Each process's RSS and CPU come from /proc.
Last, a `cronlock-sidecar gate` beside a fresh hold, from start to exit.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cronlock_operator.cronjob.config import LockConfig, parse_config
from cronlock_operator.cronjob.timing import PROBE_PERIOD_SECONDS
from cronlock_operator.injection.containers import (
    GATE_COMMAND,
    SIDECAR_COMMAND,
    gate_container,
    sidecar_container,
)
from cronlock_operator.settings import OperatorSettings
from cronlock_sidecar import contract
from cronlock_sidecar.pod.rundir import read_decision
from tests.benchmarks import BENCH_DIR, controlplane, machine, summary, table
from tests.benchmarks.sidecar import SIDECAR
from tests.support import gen
from tests.support.controlplane import ControlPlane
from tests.support.paths import ROOT
from tests.support.ports import free_port
from tests.support.tools import gotool

KINDS = ("sidecar", "client-go")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


# --- what the operator injects -------------------------------------------------------------
@dataclass(frozen=True)
class Injected:
    """One CronJob's lock settings and its sidecar's and gate's environment, as injected."""

    config: LockConfig
    hold_env: dict[str, str]
    gate_env: dict[str, str]


def injected(namespace: str, lock: str, ttl: str | None) -> Injected:
    """What the operator injects for a CronJob `lock` that sets only `cronlock.io/enabled`
    (and `cronlock.io/ttl` when given): its default timings otherwise."""
    annotations = {contract.ANNOTATION_ENABLED: "true"}
    if ttl is not None:
        annotations[contract.ANNOTATION_TTL] = ttl
    cronjob = gen.cronjob(
        lock,
        gen.in_namespace(namespace),
        gen.with_annotations(annotations),
        gen.containers({"name": "work", "image": "x"}),
    )
    settings = OperatorSettings(sidecar_image="cronlock-sidecar")
    config = parse_config(cronjob, settings)
    pod = f"{lock}-{secrets.token_hex(3)}-{secrets.token_hex(3)}"
    fields = {
        "metadata.name": pod,
        "metadata.uid": secrets.token_hex(16),
        "metadata.namespace": namespace,
        f"metadata.labels['{contract.JOB_NAME_LABEL}']": pod.rsplit("-", 1)[0],
    }
    return Injected(
        config,
        _env(sidecar_container(namespace, config, settings, None)["env"], fields),
        _env(gate_container(config, settings)["env"], fields),
    )


def _env(entries: list[dict[str, Any]], fields: Mapping[str, str]) -> dict[str, str]:
    """A container's `env`, with the kubelet's downward API values filled in."""
    env = {}
    for entry in entries:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        else:
            env[entry["name"]] = fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


# --- /proc -----------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def memory_mib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (the peak of the running program: its own, from exec on), in MiB."""
    figures = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in {"VmRSS", "VmHWM"}:
            figures[key] = int(value.split()[0]) / 1024
    return figures


def exited(pid: int) -> bool:
    """Whether a child has exited (a zombie, not reaped yet, so its usage is still there)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2] == "Z"


def reap(process: subprocess.Popen[bytes]) -> tuple[int, float]:
    """Wait for `process`: its exit code and the CPU seconds it used over its whole life."""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_utime + usage.ru_stime


# --- the API server's count of Lease requests -----------------------------------------------
def request_totals(plane: ControlPlane) -> Iterator[tuple[dict[str, str], int]]:
    """Each `apiserver_request_total` series of the API server's /metrics: labels, count."""
    for line in plane.kubectl("get", "--raw", "/metrics").splitlines():
        if line.startswith("apiserver_request_total{"):
            labels_text, _, value = line.rpartition("} ")
            yield dict(_LABEL.findall(labels_text)), int(float(value))


def lease_requests(plane: ControlPlane) -> Counter[tuple[str, str]]:
    """`apiserver_request_total{resource="leases"}` by (verb, code), from its /metrics."""
    counts: Counter[tuple[str, str]] = Counter()
    for labels, count in request_totals(plane):
        if labels.get("resource") == "leases" and labels.get("group") == "coordination.k8s.io":
            counts[labels["verb"], labels["code"]] += count
    return counts


def by_verb(counts: Mapping[tuple[str, str], int]) -> dict[str, int]:
    verbs: Counter[str] = Counter()
    for (verb, _code), count in counts.items():
        verbs[verb] += count
    return dict(sorted(verbs.items()))


def difference(
    after: Counter[tuple[str, str]], before: Counter[tuple[str, str]]
) -> Counter[tuple[str, str]]:
    return Counter({key: after[key] - before[key] for key in after if after[key] != before[key]})


# --- the holders -----------------------------------------------------------------------------
def spawn(
    argv: list[str], env: Mapping[str, str], log: Path, out: Path | None = None
) -> subprocess.Popen[bytes]:
    """A process with its stderr (and stdout, if `out`) in files."""
    with log.open("wb") as errors, (out or Path(os.devnull)).open("wb") as output:
        return subprocess.Popen(argv, env=env, stdout=output, stderr=errors)


@dataclass
class Holder:
    """One process holding one lock: a `hold` sidecar or a client-go elector."""

    kind: str
    lock: str
    process: subprocess.Popen[bytes]
    ready: Callable[[], bool]
    port: int | None = None
    rss: list[float] = field(default_factory=list)
    hwm: float = 0.0


def start_sidecar(
    plane: ControlPlane, namespace: str, lock: str, ttl: str | None, workdir: Path
) -> Holder:
    pod = injected(namespace, lock, ttl)
    port = free_port()
    run_dir = workdir / lock
    env = {
        **plane.env,
        **pod.hold_env,
        contract.ENV_PORT: str(port),
        contract.ENV_RUN_DIR: str(run_dir),
    }
    process = spawn([SIDECAR, *SIDECAR_COMMAND[1:]], env, workdir / f"{lock}.log")

    def ready() -> bool:
        decision = read_decision(run_dir)
        if decision not in (None, "run"):
            raise RuntimeError(f"sidecar of {lock} decided {decision!r}; see {workdir}/{lock}.log")
        return decision == "run"

    return Holder("sidecar", lock, process, ready, port)


def start_client_go(
    plane: ControlPlane, namespace: str, lock: str, ttl: str | None, workdir: Path
) -> Holder:
    config = injected(namespace, lock, ttl).config
    out = workdir / f"{lock}.out"
    process = spawn(
        [
            gotool("leaderelect"),
            "-kubeconfig",
            str(plane.kubeconfig),
            "-namespace",
            namespace,
            "-name",
            contract.lease_name(lock),
            "-identity",
            f"{lock}-{secrets.token_hex(4)}",
            "-lease-duration",
            f"{config.ttl_seconds}s",
            "-renew-deadline",
            f"{config.renew_deadline_seconds * 1000:.0f}ms",
            "-retry-period",
            f"{config.renew_seconds * 1000:.0f}ms",
        ],
        plane.env,
        workdir / f"{lock}.log",
        out,
    )
    return Holder("client-go", lock, process, lambda: b"leading" in out.read_bytes())


STARTERS = {"sidecar": start_sidecar, "client-go": start_client_go}


@contextmanager
def probing(holders: list[Holder], period: float) -> Iterator[None]:
    """GET /held on every sidecar once a period, as the kubelet's liveness probe does."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(period):
            for holder in holders:
                if holder.port is None:
                    continue
                url = f"http://127.0.0.1:{holder.port}{contract.HELD_PATH}"
                try:
                    with urllib.request.urlopen(url, timeout=1) as answer:
                        answer.read()
                except (urllib.error.URLError, OSError):
                    pass  # a probe failure only matters to the kubelet; exits are checked

    thread = threading.Thread(target=loop, name="probe", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def phase(
    plane: ControlPlane,
    kind: str,
    number: int,
    args: argparse.Namespace,
    namespace: str,
    workdir: Path,
) -> dict[str, Any]:
    """Start N holders of `kind`, hold D seconds once all hold, stop them; what it cost."""
    before = lease_requests(plane)
    started = time.monotonic()
    holders = [
        STARTERS[kind](plane, namespace, f"renew-{number}-{kind}-{index}", args.ttl, workdir)
        for index in range(args.locks)
    ]
    try:
        deadline = started + 60
        waiting = list(holders)
        while waiting:
            waiting = [holder for holder in waiting if not holder.ready()]
            for holder in waiting:
                if holder.process.poll() is not None:
                    raise RuntimeError(f"{kind} of {holder.lock} exited; see {workdir}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(waiting)} {kind} holders did not acquire in 60s")
            time.sleep(0.05)
        acquired = time.monotonic()
        cpu_start = {holder.lock: cpu_seconds(holder.process.pid) for holder in holders}
        end = acquired + args.duration
        with probing(holders if args.probe else [], PROBE_PERIOD_SECONDS):
            while (left := end - time.monotonic()) > 0:
                for holder in holders:
                    if holder.process.poll() is not None:
                        raise RuntimeError(f"{kind} of {holder.lock} exited while holding")
                    holder.rss.append(memory_mib(holder.process.pid)["VmRSS"])
                time.sleep(min(args.sample, left))
        held = time.monotonic() - acquired
        cpu_held = {
            holder.lock: cpu_seconds(holder.process.pid) - cpu_start[holder.lock]
            for holder in holders
        }
        for holder in holders:
            holder.hwm = memory_mib(holder.process.pid)["VmHWM"]
            holder.process.send_signal(signal.SIGTERM)
        stopping = time.monotonic()
        exits = {holder.lock: reap(holder.process) for holder in holders}
        stopped = time.monotonic()
    finally:
        for holder in holders:
            if holder.process.returncode is None:
                holder.process.kill()
                reap(holder.process)
    after = lease_requests(plane)
    failed = {lock: code for lock, (code, _) in exits.items() if code != 0}
    if failed:
        raise RuntimeError(f"{kind} holders exited non-zero: {failed}; see {workdir}")
    rss = [value for holder in holders for value in holder.rss]
    return {
        "kind": kind,
        "locks": args.locks,
        "wall_seconds": time.monotonic() - started,
        "start_to_all_acquired_seconds": acquired - started,
        "held_seconds": held,
        "sigterm_to_all_exited_seconds": stopped - stopping,
        "requests": {
            f"{verb} {code}": count for (verb, code), count in difference(after, before).items()
        },
        "rss_mib": summary(rss),
        "hwm_mib": summary([holder.hwm for holder in holders]),
        "cpu_seconds_per_minute_holding": summary(
            [seconds * 60 / held for seconds in cpu_held.values()]
        ),
        "cpu_seconds_total": summary([seconds for _, seconds in exits.values()]),
    }


def background(plane: ControlPlane, seconds: float) -> dict[str, Any]:
    """Lease requests while nothing of ours runs: the API server's own."""
    before = lease_requests(plane)
    started = time.monotonic()
    time.sleep(seconds)
    counted = difference(lease_requests(plane), before)
    window = time.monotonic() - started
    return {
        "seconds": window,
        "per_second_by_verb": {verb: count / window for verb, count in by_verb(counted).items()},
    }


def gate_runs(
    plane: ControlPlane, namespace: str, ttl: str | None, workdir: Path, repeat: int
) -> dict[str, Any]:
    """A hold and then its gate, as the kubelet starts them; the gate from start to exit."""
    peaks: list[float] = []
    cpu: list[float] = []
    walls: list[float] = []
    for index in range(repeat):
        lock = f"renew-gate-{index}"
        holder = start_sidecar(plane, namespace, lock, ttl, workdir)
        pod = injected(namespace, lock, ttl)
        started = time.monotonic()
        gate = spawn(
            [SIDECAR, *GATE_COMMAND[1:]],
            {**pod.gate_env, contract.ENV_RUN_DIR: str(workdir / lock)},
            workdir / f"{lock}-gate.log",
        )
        # VmHWM up to the last read before exit (a zombie has none): ru_maxrss would count
        # the benchmark's own memory, which the child shares between fork and exec.
        peak = 0.0
        while not exited(gate.pid):
            peak = max(peak, memory_mib(gate.pid).get("VmHWM", 0.0))
            time.sleep(0.005)
        code, seconds = reap(gate)
        walls.append(time.monotonic() - started)
        holder.process.send_signal(signal.SIGTERM)
        reap(holder.process)
        if code != contract.EXIT_OK:
            raise RuntimeError(f"gate of {lock} exited {code}; see {workdir}/{lock}-gate.log")
        peaks.append(peak)
        cpu.append(seconds)
    return {
        "peak_rss_mib": summary(peaks),
        "cpu_seconds": summary(cpu),
        "start_to_exit_seconds": summary(walls),
    }


# --- figures -----------------------------------------------------------------------------------
def per_lock_minute(phases: list[dict[str, Any]], rate: Mapping[str, float]) -> dict[str, float]:
    """Requests by verb per lock per minute held, the API server's background taken off;
    acquiring and releasing are counted in."""
    net: dict[str, float] = {}
    lock_minutes = 0.0
    for each in phases:
        for key, count in each["requests"].items():
            verb = key.split()[0]
            net[verb] = net.get(verb, 0.0) + count
        for verb, per_second in rate.items():
            net[verb] = net.get(verb, 0.0) - per_second * each["wall_seconds"]
        lock_minutes += each["locks"] * each["held_seconds"] / 60
    figures = {verb: count / lock_minutes for verb, count in sorted(net.items())}
    figures["all"] = sum(figures.values())
    return figures


def ratios(sidecar: Mapping[str, float], client_go: Mapping[str, float]) -> dict[str, float | None]:
    return {
        verb: (sidecar.get(verb, 0.0) / client_go[verb] if client_go.get(verb, 0.0) > 0 else None)
        for verb in sorted({*sidecar, *client_go}, key=lambda verb: (verb == "all", verb))
    }


def _processes(phases: list[dict[str, Any]]) -> dict[str, float]:
    """Medians over phases of each phase's median (and the largest maximum)."""

    def median(key: str, figure: str) -> float:
        return summary([each[key][figure] for each in phases])["median"]

    return {
        "rss_median_mib": median("rss_mib", "median"),
        "rss_max_mib": max(each["rss_mib"]["max"] for each in phases),
        "hwm_max_mib": max(each["hwm_mib"]["max"] for each in phases),
        "cpu_seconds_per_minute_median": median("cpu_seconds_per_minute_holding", "median"),
        "cpu_seconds_per_minute_max": max(
            each["cpu_seconds_per_minute_holding"]["max"] for each in phases
        ),
        "cpu_seconds_total_median": median("cpu_seconds_total", "median"),
    }


def _number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report(results: dict[str, Any]) -> str:
    requests = results["requests_per_lock_minute"]
    rows = [
        [
            verb,
            _number(requests["sidecar"].get(verb)),
            _number(requests["client-go"].get(verb)),
            _number(ratio) + ("x" if ratio is not None else ""),
        ]
        for verb, ratio in results["ratio_sidecar_to_client_go"].items()
    ]
    first = table(
        ["Lease requests per lock per minute", "sidecar hold", "client-go", "sidecar / client-go"],
        rows,
    )
    phase_rows = [
        [
            f"{index // 2 + 1}",
            each["kind"],
            str(each["locks"]),
            f"{each['held_seconds']:.0f}",
            ", ".join(f"{key}: {count:g}" for key, count in sorted(each["requests"].items())),
        ]
        for index, each in enumerate(results["phases"])
    ]
    second = table(
        ["pair", "phase", "locks", "held s", "requests counted, background in (verb code)"],
        phase_rows,
    )
    process_rows = []
    for kind in KINDS:
        figures = results["processes"][kind]
        process_rows.append(
            [
                "cronlock-sidecar hold" if kind == "sidecar" else "client-go leaderelect",
                f"{figures['rss_median_mib']:.1f}",
                f"{figures['rss_max_mib']:.1f}",
                f"{figures['hwm_max_mib']:.1f}",
                f"{figures['cpu_seconds_per_minute_median']:.3f}",
                f"{figures['cpu_seconds_per_minute_max']:.3f}",
                f"{figures['cpu_seconds_total_median']:.2f}",
            ]
        )
    third = table(
        [
            "process",
            "RSS median MiB",
            "RSS max MiB",
            "VmHWM max MiB",
            "CPU s/min median",
            "CPU s/min max",
            "CPU s life median",
        ],
        process_rows,
    )
    gate = results["gate"]
    fourth = table(
        ["cronlock-sidecar gate, start to exit", "median", "max", "n"],
        [
            [
                label,
                f"{gate[key]['median']:.{digits}f}",
                f"{gate[key]['max']:.{digits}f}",
                str(gate[key]["n"]),
            ]
            for label, key, digits in (
                ("peak RSS (VmHWM) MiB", "peak_rss_mib", 1),
                ("CPU seconds", "cpu_seconds", 2),
                ("wall seconds", "start_to_exit_seconds", 2),
            )
        ],
    )
    return f"{first}\n\n{second}\n\n{third}\n\n{fourth}"


def run(plane: ControlPlane, args: argparse.Namespace) -> dict[str, Any]:
    namespace = f"bench-renewals-{secrets.token_hex(3)}"
    config = injected(namespace, "renew", args.ttl).config  # a bad --ttl fails here
    plane.kubectl("create", "namespace", namespace)
    results: dict[str, Any] = {
        "namespace": namespace,
        "ttl_seconds": config.ttl_seconds,
        "renew_seconds": config.renew_seconds,
        "renew_deadline_seconds": config.renew_deadline_seconds,
    }
    try:
        with tempfile.TemporaryDirectory(prefix="cronlock-renewals-") as workdir:
            print(f"background: {args.baseline:g}s with nothing running ...", flush=True)
            results["background"] = background(plane, args.baseline)
            phases = []
            for pair in range(args.pairs):
                for kind in KINDS:
                    print(
                        f"pair {pair + 1}/{args.pairs}: {args.locks} locks held by {kind} "
                        f"for {args.duration:g}s ...",
                        flush=True,
                    )
                    phases.append(phase(plane, kind, pair, args, namespace, Path(workdir)))
            results["phases"] = phases
            print(f"gate: {args.gates} runs ...", flush=True)
            results["gate"] = gate_runs(plane, namespace, args.ttl, Path(workdir), args.gates)
    finally:
        plane.kubectl("delete", "namespace", namespace, "--wait=false")
    rate = results["background"]["per_second_by_verb"]
    of_kind = {kind: [each for each in phases if each["kind"] == kind] for kind in KINDS}
    requests = {kind: per_lock_minute(of_kind[kind], rate) for kind in KINDS}
    results["requests_per_lock_minute"] = requests
    results["ratio_sidecar_to_client_go"] = ratios(requests["sidecar"], requests["client-go"])
    results["processes"] = {kind: _processes(of_kind[kind]) for kind in KINDS}
    print(report(results), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks renewals", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--locks", type=int, default=20, help="locks held at once (20)")
    parser.add_argument(
        "--duration", type=float, default=120, help="seconds each phase holds them (120)"
    )
    parser.add_argument("--pairs", type=int, default=2, help="sidecar, client-go pairs (2)")
    parser.add_argument(
        "--ttl",
        help="cronlock.io/ttl of every lock, renew a third of it (the operator's default ttl)",
    )
    parser.add_argument(
        "--baseline", type=float, default=60, help="seconds to count the background (60)"
    )
    parser.add_argument("--sample", type=float, default=5, help="seconds between RSS reads (5)")
    parser.add_argument(
        "--no-probe",
        dest="probe",
        action="store_false",
        help="no GET /held on each sidecar every second (the kubelet's liveness probe)",
    )
    parser.add_argument("--gates", type=int, default=5, help="gate runs measured (5)")
    parser.add_argument(
        "--output", type=Path, default=BENCH_DIR, help=f"JSON and control plane files ({BENCH_DIR})"
    )
    parser.add_argument(
        "--keep-controlplane", action="store_true", help="leave the control plane running"
    )
    args = parser.parse_args(argv)
    if args.locks < 1 or args.pairs < 1 or args.gates < 1:
        parser.error("--locks, --pairs and --gates: at least 1")
    if args.duration <= 0 or args.baseline <= 0 or args.sample <= 0:
        parser.error("--duration, --baseline and --sample: more than 0 seconds")
    command = shlex.join(["python", "-m", "tests.benchmarks", "renewals", *(argv or [])])
    args.output.mkdir(parents=True, exist_ok=True)
    # As in the image, where pip compiled them (see tests/benchmarks/sidecar.py).
    compileall.compile_dir(ROOT / "sidecar" / "src", quiet=1)
    print(f"client-go tool: {gotool('leaderelect')}", flush=True)
    with controlplane(args.output, keep=args.keep_controlplane) as plane:
        results = run(plane, args)
    document = {
        "benchmark": "renewals",
        "command": command,
        "machine": machine(),
        "results": results,
    }
    path = args.output / "renewals.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {path}", flush=True)
    return 0
