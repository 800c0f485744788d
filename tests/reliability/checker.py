"""Mutual-exclusion checker: many contenders, random faults, overlaps counted without clocks.

Every contender is a real `cronlock-sidecar run --policy wait` (or `--policy replace`,
where every new contender stops the holder's work and takes over) process whose CMD is a work
unit that holds an exclusive, non-blocking `flock` on one local file for its whole life.
Two work units alive at once cannot both hold it: a failed `flock` is an overlap, whatever
any clock says. Each work unit also appends its start and end (JSON lines, CLOCK_MONOTONIC,
which all processes on the machine share) and writes its fencing token to a store that
refuses tokens older than the newest it has seen. Each contender's wall clock is off by a
random amount within `--clock-spread` (tests/reliability/skewed.py), as nodes' clocks are.

    .venv/bin/python -m tests.reliability.checker --trials 60 --contenders 4

starts its own control plane under .testenv/reliability (or uses $KUBECONFIG with
--kubeconfig-only, without the control plane faults) and prints a JSON report.

    .venv/bin/python -m tests.reliability.checker --store redis|postgres --trials 30

holds the lock in Redis or PostgreSQL instead (`run --store`; the server from Debian,
started here on loopback, tests/support/stores.py), with the store's own faults (the server
paused, killed and restarted, a slow or cut network to it) beside the process faults. There a
contender's clock far ahead is inside the guarantee: the store's clock judges age.

    .venv/bin/python -m tests.reliability.checker --ticks --store redis --contenders 2

counts ticks (tests/reliability/tick_counts.py): every --tick-spacing seconds a new tick,
each given to --contenders processes `run --tick T --tick-of reliability` started a moment
apart, as two clusters' pods of one tick start; under the same faults, no tick may be
worked twice and none lost while a contender of it could reach the lock.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import yaml

from tests.reliability import ha_faults
from tests.reliability.ha_faults import HA_FAULTS
from tests.reliability.proxy import DelayingProxy
from tests.reliability.tick_counts import TickCounts, count_ticks, skips_in
from tests.reliability.work_unit import work_script
from tests.support.controlplane import ControlPlane, own_controlplane
from tests.support.paths import ROOT, SIDECAR
from tests.support.processes import ControlPlaneProcesses, alive, children, signal_all, sweep
from tests.support.stores import running

MARKER = "CRONLOCK_RELIABILITY_MARK"
TICK = 0.05
# Tick mode: whose ticks the contenders work (`run --tick-of`).
TICKS_OF = "reliability"

# Faults inside the guarantee: the checker must see 0 overlaps with any mix of them.
PROCESS_FAULTS = ("kill-holder", "stop-holder", "kill-cmd", "stop-cmd", "kill-pod", "stop-pod")
CONTROL_PLANE_FAULTS = (
    "pause-apiserver",
    "restart-apiserver",
    "pause-etcd",
    "restart-etcd",
    "slow-network",
)
GUARANTEED_FAULTS = PROCESS_FAULTS + CONTROL_PLANE_FAULTS
# With --ha (3 etcd members, 2 API servers behind a balancer): tests/reliability/ha_faults.py.
HA_GUARANTEED_FAULTS = (*PROCESS_FAULTS, *HA_FAULTS, "slow-network")
# Outside the guarantee, overlaps are expected there; the fencing store must refuse the
# stale holder's writes. The whole holder frozen for longer than ttl + skew, then resumed:
FREEZE = "freeze-pod"
# A contender whose wall clock is ahead by more than the model allows (ttl + skew + 1..3s):
CLOCK_AHEAD = "clock-ahead"
OUTSIDE_FAULTS = (FREEZE, CLOCK_AHEAD)
# With the lock in Redis or PostgreSQL (--store): the server's own faults, and the network
# to it; a clock far ahead is inside the guarantee there (the store's clock judges age).
STORE_FAULTS = ("pause-store", "restart-store", "slow-network", "cut-network")
STORE_GUARANTEED_FAULTS = (*PROCESS_FAULTS, *STORE_FAULTS, CLOCK_AHEAD)
ALL_FAULTS = (
    *GUARANTEED_FAULTS, *OUTSIDE_FAULTS, *HA_FAULTS, "pause-store", "restart-store", "cut-network"
)  # fmt: skip


class StoreServer(Protocol):
    """A running Redis or PostgreSQL (tests/support/stores.py)."""

    url: str
    port: int

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def restart(self) -> float: ...


WORK = work_script(
    """
    import fcntl, json, os, signal, sys, time
    lock_path, events_path, store_path, seconds = sys.argv[1:5]
    # `run` passes the token in the environment; in a pod the sidecar writes it to a file.
    token = int(os.environ.get("CRONLOCK_FENCING_TOKEN")
                or open("/var/run/cronlock/fencing-token").read())
    def record(event, **fields):
        line = json.dumps({"event": event, "pid": os.getpid(), "run": os.getppid(),
                           "token": token, "mono": time.monotonic(),
                           "tick": os.environ.get("CRONLOCK_TICK", ""), **fields})
        fd = os.open(events_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\\n").encode())
        finally:
            os.close(fd)
    def on_term(signum, frame):
        record("stopped", signal=signum)
        os._exit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)
    """
)


@dataclass(frozen=True)
class Settings:
    ttl: float = 6.0
    renew: float = 1.0
    skew: float = 2.0
    slack: float = 4.0
    contenders: int = 3
    runs_per_trial: int = 4
    work: tuple[float, float] = (1.0, 2.5)
    wait_timeout: float = 30.0
    trial_timeout: float = 120.0
    # Every contender's wall clock is off by a random amount in [-spread/2, +spread/2].
    clock_spread: float = 0.0
    # wait: contenders queue up; replace: each new one has the holder stop and yield.
    policy: str = "wait"
    # Tick mode: a new tick every tick_spacing seconds, given to `contenders` processes
    # started within tick_stagger of each other; runs_per_trial is then ticks per trial.
    ticks: bool = False
    tick_spacing: float = 2.0
    tick_stagger: float = 0.5
    # Each contender works ticks of its own name (`--tick-of reliability-N`): the same tick
    # then is no shared tick, and is worked twice (the tick count's negative control).
    tick_of_each: bool = False

    def __post_init__(self) -> None:
        if self.policy not in ("wait", "replace"):
            raise ValueError(f"policy {self.policy!r}: the checker runs wait or replace")
        if not 0 <= self.clock_spread < self.clock_bound:
            raise ValueError(
                f"clock spread {self.clock_spread:g}s is outside the guarantee: two clocks may "
                f"differ by less than skew + ttl/3 - kill grace = {self.clock_bound:g}s "
                f"(docs/RELIABILITY.md); use the {CLOCK_AHEAD} fault to go beyond it"
            )

    @property
    def recovery_bound(self) -> float:
        """Longest a lock may stay unused after a fault: ttl + skew + slack."""
        return self.ttl + self.skew + self.slack

    @property
    def clock_bound(self) -> float:
        """How far apart two contenders' wall clocks may be: skew + ttl/3 - kill grace."""
        kill_grace = min(5.0, self.ttl / 3)  # the sidecar's default
        return self.skew + self.ttl / 3 - kill_grace


@dataclass
class Fault:
    kind: str
    trial: int
    detail: str = ""
    fired: float = 0.0
    cleared: float = 0.0
    holder_run: int = 0
    holder_cmd: int = 0
    recovery: float | None = None
    error: str = ""

    @property
    def delayed(self) -> bool:
        return self.recovery is None

    def summary(self, bound: float) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "trial": self.trial,
            "detail": self.detail,
            "recovery_s": None if self.recovery is None else round(self.recovery, 2),
            "delayed": self.recovery is None or self.recovery > bound,
            "error": self.error,
        }


@dataclass(kw_only=True)
class Counts:
    """What the work units of one trial did, as their events tell (`_TrialState.tally`)."""

    runs: int = 0
    completed: int = 0
    stopped: int = 0
    overlaps: int = 0
    refused: int = 0
    timed_out: bool = False
    seconds: float = 0.0


@dataclass
class Trial(Counts):
    index: int
    faults: list[Fault]
    exit_codes: dict[int, int] = field(default_factory=dict)
    ticks: TickCounts = field(default_factory=TickCounts)


class FaultedTrial(Protocol):
    """What a fault row needs of a trial (checker.py's and pods.py's trials)."""

    index: int
    overlaps: int
    refused: int

    @property
    def faults(self) -> Sequence[Fault]: ...


def fault_rows(trials: Sequence[FaultedTrial], bound: float) -> dict[str, dict[str, Any]]:
    """Per fault kind: faults, overlaps and refused writes in its trials, delays, recovery."""
    faults = [fault for trial in trials for fault in trial.faults]
    rows: dict[str, dict[str, Any]] = {}
    for kind in sorted({fault.kind for fault in faults}):
        mine = [fault for fault in faults if fault.kind == kind]
        trials_with = {fault.trial for fault in mine}
        recoveries = [fault.recovery for fault in mine if fault.recovery is not None]
        rows[kind] = {
            "faults": len(mine),
            "overlaps": sum(t.overlaps for t in trials if t.index in trials_with),
            "refused_stale_writes": sum(t.refused for t in trials if t.index in trials_with),
            "delayed": sum(fault.summary(bound)["delayed"] for fault in mine),
            "recovery_max_s": round(max(recoveries), 2) if recoveries else None,
            "errors": [fault.error for fault in mine if fault.error],
        }
    return rows


# Where contenders go: the kubeconfig, the env for kubectl, the control plane's pids.
Cluster = ControlPlane


def components_of(cluster: ControlPlane) -> ControlPlaneProcesses | None:
    """The local control plane's processes, to fault; None for a cluster of the user's own."""
    return None if cluster.env_dir is None else ControlPlaneProcesses(cluster.env_dir, cluster.env)


def proxied_kubeconfig(kubeconfig: Path, port: int, target: Path) -> Path:
    """The kubeconfig with its server moved to the relay (JSON: the sidecar reads it fast)."""
    config = yaml.safe_load(kubeconfig.read_text())
    for cluster in config["clusters"]:
        server = urlsplit(cluster["cluster"]["server"])
        if server.hostname not in {"127.0.0.1", "localhost"}:
            raise ValueError(f"only a loopback API server can be relayed, not {server.hostname}")
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    target.write_text(json.dumps(config))
    target.chmod(0o600)
    return target


def api_port(kubeconfig: Path) -> int:
    config = yaml.safe_load(kubeconfig.read_text())
    port = urlsplit(str(config["clusters"][0]["cluster"]["server"])).port
    if port is None:
        raise ValueError("the kubeconfig's server names no port")
    return port


class Checker:
    """Runs trials against one cluster; `run()` returns the report."""

    def __init__(
        self,
        cluster: Cluster,
        workdir: Path,
        settings: Settings,
        faults: Sequence[str],
        seed: int,
        log: Callable[[str], None] = lambda line: None,
        store: tuple[str, StoreServer] | None = None,
    ) -> None:
        unknown = set(faults) - set(ALL_FAULTS)
        if unknown:
            raise ValueError(f"unknown faults: {', '.join(sorted(unknown))}")
        # (kind, server): the lock in Redis or PostgreSQL, reached through the proxy.
        self.store = store
        self.outside: tuple[str, ...] = (FREEZE,) if store else OUTSIDE_FAULTS
        if store is not None and set(faults) & set(CONTROL_PLANE_FAULTS) - {"slow-network"}:
            raise ValueError("with --store, the control plane holds no lock: no faults there")
        if store is None and set(faults) & {"pause-store", "restart-store", "cut-network"}:
            raise ValueError("store faults need --store")
        self.cluster = cluster
        self.mark = secrets.token_hex(6)
        self.workdir = workdir / f"{time.strftime('%Y%m%dT%H%M%S')}-{self.mark}"
        self.settings = settings
        self.faults = list(faults)
        self.random = random.Random(seed)  # noqa: S311 - reproducible fault schedules
        self.seed = seed
        self.log = log
        self.namespace = f"cronlock-reliability-{self.mark}"
        self.components = components_of(cluster)
        if self.components is None and set(self.faults) & set(CONTROL_PLANE_FAULTS) - {
            "slow-network"
        }:
            raise ValueError(
                "control plane faults need the local control plane (tests/controlplane)"
            )
        ha = ha_faults.is_ha(self.components)
        if set(self.faults) & set(HA_FAULTS) and not ha:
            raise ValueError(f"{', '.join(HA_FAULTS)} need an HA control plane (--ha)")
        if ha and set(self.faults) & set(CONTROL_PLANE_FAULTS) - {"slow-network"}:
            raise ValueError(f"on an HA control plane its faults are {', '.join(HA_FAULTS)}")
        upstream = store[1].port if store is not None else api_port(cluster.kubeconfig)
        self.proxy = DelayingProxy("127.0.0.1", upstream)
        self.trials: list[Trial] = []
        self.offsets: list[float] = []
        # Where the current trial's contenders go, for faults that start one of their own.
        self._spawn: Callable[[float], subprocess.Popen[bytes]] | None = None
        self._work = settings.work

    # --- the whole run ----------------------------------------------------------------
    def run(self, trials: int, faults_per_trial: int = 2) -> dict[str, Any]:
        self.workdir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        plan = self._plan(trials, faults_per_trial)
        with self._namespace(), self.proxy:
            kubeconfig = proxied_kubeconfig(
                self.cluster.kubeconfig, self.proxy.port, self.workdir / "proxied.kubeconfig"
            )
            for index, kinds in enumerate(plan):
                trial = self._trial(index, kinds, kubeconfig)
                self.trials.append(trial)
                bound = self.settings.recovery_bound
                recoveries = [fault.summary(bound)["recovery_s"] for fault in trial.faults]
                details = [fault.detail or fault.error for fault in trial.faults]
                ticks = (
                    f"ticks {trial.ticks.ticks} twice {trial.ticks.worked_twice} lost "
                    f"{trial.ticks.lost_while_healthy} "
                    if self.settings.ticks
                    else ""
                )
                self.log(
                    f"trial {index}: faults {','.join(kinds) or '-'} {details} runs {trial.runs} "
                    f"overlaps {trial.overlaps} refused {trial.refused} {ticks}recovery "
                    f"{recoveries} {'TIMED OUT ' if trial.timed_out else ''}{trial.seconds:.1f}s"
                )
        return self.report(time.monotonic() - started)

    def _plan(self, trials: int, per_trial: int) -> list[list[str]]:
        """Every fault kind as evenly as the trials allow, in random order.

        A fault outside the guarantee gets trials of its own (one per fault kind's share), so
        its expected overlaps are never mixed with the faults inside the guarantee.
        """
        guaranteed = [kind for kind in self.faults if kind not in self.outside]
        outside = [kind for kind in self.outside if kind in self.faults]
        plan: list[list[str]] = [[] for _ in range(trials)] if not outside else []
        if guaranteed:
            kinds = [guaranteed[i % len(guaranteed)] for i in range(trials * per_trial)]
            self.random.shuffle(kinds)
            plan = [kinds[i * per_trial : (i + 1) * per_trial] for i in range(trials)]
        for kind in outside:
            plan += [[kind] for _ in range(max(1, trials // len(self.faults)))]
        return plan

    def report(self, seconds: float) -> dict[str, Any]:
        bound = self.settings.recovery_bound
        faults = [fault for trial in self.trials for fault in trial.faults]
        by_kind = fault_rows(self.trials, bound)
        codes: collections.Counter[int] = collections.Counter()
        for trial in self.trials:
            codes.update(trial.exit_codes)
        guaranteed = [t for t in self.trials if all(f.kind not in self.outside for f in t.faults)]
        ticks = TickCounts()
        for trial in guaranteed:
            ticks.add(trial.ticks)
        return {
            "seed": self.seed,
            "store": self.store[0] if self.store else "lease",
            "settings": {**asdict(self.settings), "recovery_bound_s": bound},
            "trials": len(self.trials),
            "faults": len(faults),
            "runs": sum(t.runs for t in self.trials),
            "completed_runs": sum(t.completed for t in self.trials),
            "stopped_runs": sum(t.stopped for t in self.trials),
            "overlaps": sum(t.overlaps for t in guaranteed),
            "overlaps_outside_guarantee": sum(t.overlaps for t in self.trials)
            - sum(t.overlaps for t in guaranteed),
            "refused_stale_writes": sum(t.refused for t in self.trials),
            "delayed": sum(f.summary(bound)["delayed"] for f in faults),
            "timed_out_trials": sum(t.timed_out for t in self.trials),
            "fault_errors": sum(bool(f.error) for f in faults),
            "exit_codes": {str(code): count for code, count in sorted(codes.items())},
            "clock_offsets_s": (
                [round(min(self.offsets), 2), round(max(self.offsets), 2)] if self.offsets else None
            ),
            "by_fault": by_kind,
            # Tick mode, in the trials inside the guarantee: worked_twice and
            # lost_while_healthy must be 0.
            "ticks": ticks.summary() if self.settings.ticks else None,
            "seconds": round(seconds, 1),
        }

    @contextmanager
    def _namespace(self) -> Iterator[None]:
        kubectl = ["kubectl", "--kubeconfig", str(self.cluster.kubeconfig)]
        subprocess.run(
            [*kubectl, "create", "namespace", self.namespace],
            env=self.cluster.env,
            capture_output=True,
            check=True,
            timeout=60,
        )
        try:
            yield
        finally:
            if self.components is not None:
                self.components.resume_all()
            self.proxy.delay = 0.0
            subprocess.run(
                [*kubectl, "delete", "namespace", self.namespace, "--wait=false"],
                env=self.cluster.env,
                capture_output=True,
                check=False,
                timeout=60,
            )

    # --- one trial ----------------------------------------------------------------------
    def _trial(self, index: int, kinds: list[str], kubeconfig: Path) -> Trial:
        if self.settings.ticks:
            return self._tick_trial(index, kinds, kubeconfig)
        directory = self.workdir / f"trial-{index:03d}"
        directory.mkdir(exist_ok=True)
        events_path = directory / "events.jsonl"
        trial = Trial(index, [Fault(kind, index) for kind in kinds])
        state = _TrialState(events_path)
        slots: list[subprocess.Popen[bytes] | None] = [None] * self.settings.contenders
        respawn_at = [0.0] * self.settings.contenders
        threads: list[threading.Thread] = []
        pending = list(trial.faults)
        next_fault_after: float | None = None
        started = time.monotonic()
        deadline = started + self.settings.trial_timeout
        stderr = open(directory / "contenders.log", "ab")  # noqa: SIM115 - closed in finally
        self._spawn = lambda offset: self._contender(index, kubeconfig, directory, stderr, offset)
        # A clock far ahead takes the Lease from a live holder only if the holder still works
        # when the new contender has started up: its trials get longer work units.
        longest = self.settings.work[1]
        self._work = (2 * longest, 3 * longest) if CLOCK_AHEAD in kinds else self.settings.work
        try:
            while True:
                now = time.monotonic()
                state.read()
                state.observe(now)
                for slot, process in enumerate(slots):
                    if process is not None and process.poll() is not None:
                        code = process.returncode
                        trial.exit_codes[code] = trial.exit_codes.get(code, 0) + 1
                        slots[slot] = None
                        respawn_at[slot] = now + 0.3
                    if (
                        slots[slot] is None
                        and now >= respawn_at[slot]
                        and not self._enough(state, trial, pending, threads)
                    ):
                        slots[slot] = self._contender(index, kubeconfig, directory, stderr)
                next_fault_after = self._fault_on_holder(state, pending, threads, next_fault_after)
                if self._enough(state, trial, pending, threads) and not state.running:
                    break
                if now >= deadline:
                    trial.timed_out = True
                    break
                time.sleep(TICK)
        finally:
            for thread in threads:
                thread.join(timeout=90)
            if self.components is not None:
                self.components.resume_all()
            self.proxy.delay = 0.0
            self.proxy.cut = False
            self._stop(slots, trial)
            stderr.close()
        state.tally(trial, trial.faults)
        trial.seconds = time.monotonic() - started
        return trial

    def _fault_on_holder(
        self,
        state: _TrialState,
        pending: list[Fault],
        threads: list[threading.Thread],
        next_fault_after: float | None,
    ) -> float | None:
        """The next pending fault, on the work unit running last, a moment after its start
        and once the fault before has ended; returns when the next may fire."""
        if not pending or not state.running:
            return next_fault_after
        holder = state.running[-1]
        if next_fault_after is None:
            return holder.start + self.random.uniform(0.2, 1.0)
        if time.monotonic() >= next_fault_after and not any(t.is_alive() for t in threads):
            fault = pending.pop(0)
            fault.holder_cmd, fault.holder_run = holder.pid, holder.run
            thread = threading.Thread(target=self._inject, args=(fault,), daemon=True)
            thread.start()
            threads.append(thread)
            return None
        return next_fault_after

    def _tick_trial(self, index: int, kinds: list[str], kubeconfig: Path) -> Trial:
        """Tick mode: a tick every tick_spacing seconds, each given to `contenders` runs
        started within tick_stagger; faults on the work unit running last, as above."""
        settings = self.settings
        directory = self.workdir / f"trial-{index:03d}"
        directory.mkdir(exist_ok=True)
        trial = Trial(index, [Fault(kind, index) for kind in kinds])
        state = _TrialState(directory / "events.jsonl")
        issued: list[str] = []
        # (when, tick): contenders still to start; (tick, process): started, not yet ended.
        due: list[tuple[float, str, int]] = []
        live: list[tuple[str, subprocess.Popen[bytes]]] = []
        exits: list[tuple[str, int]] = []
        threads: list[threading.Thread] = []
        pending = list(trial.faults)
        next_fault_after: float | None = None
        started = time.monotonic()
        deadline = started + settings.trial_timeout
        next_tick = started
        log_path = directory / "contenders.log"
        stderr = open(log_path, "ab")  # noqa: SIM115 - closed in finally
        # A clock-ahead contender works the latest tick, beside its own contenders.
        self._spawn = lambda offset: self._contender(
            index, kubeconfig, directory, stderr, offset, tick=issued[-1] if issued else None
        )
        longest = settings.work[1]
        self._work = (2 * longest, 3 * longest) if CLOCK_AHEAD in kinds else settings.work
        try:
            while True:
                now = time.monotonic()
                state.read()
                state.observe(now)
                for tick, process in list(live):
                    if process.poll() is not None:
                        code = process.returncode
                        trial.exit_codes[code] = trial.exit_codes.get(code, 0) + 1
                        exits.append((tick, code))
                        live.remove((tick, process))
                enough = len(issued) >= settings.runs_per_trial and self._recovered(
                    state, trial, pending, threads
                )
                if now >= next_tick and not enough:
                    # The tick is the wall clock's second, as a CronJob's is its minute.
                    tick = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                    if not issued or tick > issued[-1]:
                        issued.append(tick)
                        due += [
                            (now + self.random.uniform(0, settings.tick_stagger), tick, number)
                            for number in range(settings.contenders)
                        ]
                        next_tick = now + settings.tick_spacing
                for when, tick, number in sorted(due):
                    if when <= now:
                        due.remove((when, tick, number))
                        of = f"{TICKS_OF}-{number}" if settings.tick_of_each else TICKS_OF
                        process = self._contender(
                            index, kubeconfig, directory, stderr, tick=tick, tick_of=of
                        )
                        live.append((tick, process))
                next_fault_after = self._fault_on_holder(state, pending, threads, next_fault_after)
                if enough and not due and not live and not state.running:
                    break
                if now >= deadline:
                    trial.timed_out = True
                    break
                time.sleep(TICK)
        finally:
            for thread in threads:
                thread.join(timeout=90)
            if self.components is not None:
                self.components.resume_all()
            self.proxy.delay = 0.0
            self.proxy.cut = False
            self._stop([process for _, process in live], trial)
            stderr.close()
        for tick, process in live:
            exits.append((tick, process.returncode))
        state.tally(trial, trial.faults)
        trial.ticks = count_ticks(
            issued,
            [(start.tick, start.run) for start in state.starts],
            exits,
            skips_in(log_path.read_text(errors="replace")),
        )
        trial.seconds = time.monotonic() - started
        return trial

    def _recovered(
        self,
        state: _TrialState,
        trial: Trial,
        pending: list[Fault],
        threads: list[threading.Thread],
    ) -> bool:
        """Every fault injected and cleared, and a run started after each."""
        if pending or any(thread.is_alive() for thread in threads):
            return False
        return all(state.recovery(fault) is not None for fault in trial.faults)

    def _enough(
        self,
        state: _TrialState,
        trial: Trial,
        pending: list[Fault],
        threads: list[threading.Thread],
    ) -> bool:
        """Enough runs, every fault injected and cleared, and a run started after each."""
        if pending or any(thread.is_alive() for thread in threads):
            return False
        if len(state.starts) < self.settings.runs_per_trial:
            return False
        return all(state.recovery(fault) is not None for fault in trial.faults)

    def _contender(
        self,
        trial: int,
        kubeconfig: Path,
        directory: Path,
        stderr: Any,
        offset: float | None = None,
        tick: str | None = None,
        tick_of: str = TICKS_OF,
    ) -> subprocess.Popen[bytes]:
        """A `run` contender; its wall clock `offset` seconds off (random within the spread);
        in tick mode working `tick` (a run id of its own: two contenders are two runs)."""
        settings = self.settings
        work = self.random.uniform(*self._work)
        if offset is None and settings.clock_spread:
            offset = self.random.uniform(-settings.clock_spread / 2, settings.clock_spread / 2)
            self.offsets.append(offset)
        env = {
            **self.cluster.env,
            "KUBECONFIG": str(kubeconfig),
            MARKER: self.mark,
        }
        if self.store is not None:
            del env["KUBECONFIG"]
            env["CRONLOCK_STORE"] = _through(self.store[1].url, self.proxy.port)
        sidecar = [str(SIDECAR)]
        if offset is not None:
            env["PYTHONPATH"] = str(ROOT)
            sidecar = [sys.executable, "-m", "tests.reliability.skewed", f"{offset:+.3f}"]
        argv = [
            *sidecar, "run",
            "--lease", f"{self.namespace}/lock-{trial}",
            "--ttl", f"{settings.ttl:g}s",
            "--renew", f"{settings.renew:g}s",
            "--skew", f"{settings.skew:g}s",
            "--policy", settings.policy,
            "--wait-timeout", f"{settings.wait_timeout:g}s",
            *(["--tick", tick, "--tick-of", tick_of] if tick is not None else []),
            "--",
            sys.executable, "-c", WORK,
            str(directory / "flock"), str(directory / "events.jsonl"),
            str(directory / "fencing-store"), f"{work:.2f}",
        ]  # fmt: skip
        return subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )

    def _stop(self, slots: Sequence[subprocess.Popen[bytes] | None], trial: Trial) -> None:
        """SIGTERM the contenders (they release), then sweep everything we started."""
        live = [process for process in slots if process is not None]
        for process in live:
            signal_all([process.pid], signal.SIGCONT)
            process.terminate()
        for process in live:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        sweep(MARKER, self.mark)

    # --- faults -------------------------------------------------------------------------
    def _inject(self, fault: Fault) -> None:
        settings = self.settings
        fault.fired = time.monotonic()
        run_pid, cmd_pid = fault.holder_run, fault.holder_cmd
        pod = [run_pid, *children(run_pid)]  # run, its watchdog and CMD
        components = self.components
        try:
            if fault.kind == "kill-holder":
                signal_all([run_pid], signal.SIGKILL)
            elif fault.kind == "kill-cmd":
                signal_all([cmd_pid], signal.SIGKILL)
            elif fault.kind == "kill-pod":
                signal_all(pod, signal.SIGKILL)
            elif fault.kind in {"stop-holder", "stop-cmd", "stop-pod", FREEZE}:
                if fault.kind == "stop-holder":
                    targets, seconds = (
                        [run_pid],
                        self.random.uniform(2, settings.ttl + settings.skew + 2),
                    )
                elif fault.kind == "stop-cmd":
                    targets, seconds = [cmd_pid], self.random.uniform(1, settings.ttl + 2)
                elif fault.kind == "stop-pod":
                    # Frozen for less than ttl - renew: the lease cannot have moved on yet.
                    targets, seconds = pod, self.random.uniform(1, settings.ttl - settings.renew)
                else:
                    targets = pod
                    seconds = self.random.uniform(3, 5) + settings.ttl + settings.skew
                fault.detail = f"{seconds:.1f}s"
                if fault.kind == FREEZE:
                    # A resumed host runs its processes in no set order: let the work unit
                    # go first, as the watchdog cannot be relied on to win that race.
                    self._frozen([cmd_pid], seconds, then=[pid for pid in pod if pid != cmd_pid])
                else:
                    self._frozen(targets, seconds)
            elif fault.kind == CLOCK_AHEAD:
                # One more contender, its wall clock so far ahead that the live holder's
                # Lease looks expired to it at once.
                offset = settings.ttl + settings.skew + self.random.uniform(1, 3)
                if self._spawn is None:
                    raise RuntimeError("no trial is running")
                contender = self._spawn(offset)
                try:
                    code = contender.wait(timeout=settings.wait_timeout + settings.work[1] + 10)
                except subprocess.TimeoutExpired:
                    contender.kill()
                    code = contender.wait()
                fault.detail = f"+{offset:.1f}s, exit {code}"
            elif fault.kind == "slow-network":
                delay = self.random.uniform(0.3, settings.ttl)
                seconds = self.random.uniform(2, settings.ttl + 2)
                fault.detail = f"+{delay:.1f}s for {seconds:.1f}s"
                self.proxy.delay = delay
                try:
                    time.sleep(seconds)
                finally:
                    self.proxy.delay = 0.0
                time.sleep(delay)  # bytes already queued still arrive late
            elif fault.kind == "cut-network":
                self._for_a_while(fault, lambda: setattr(self.proxy, "cut", True),
                                  lambda: setattr(self.proxy, "cut", False))  # fmt: skip
            elif fault.kind == "pause-store" and self.store is not None:
                server = self.store[1]
                self._for_a_while(fault, server.pause, server.resume)
            elif fault.kind == "restart-store" and self.store is not None:
                fault.cleared = self.store[1].restart()
                fault.detail = f"back after {fault.cleared - fault.fired:.1f}s"
                return
            elif components is not None and fault.kind in HA_FAULTS:
                fault.detail, fault.cleared = ha_faults.inject(
                    fault.kind, components, self.random, settings.ttl
                )
                return
            elif components is not None and fault.kind.startswith("pause-"):
                component = "etcd" if fault.kind == "pause-etcd" else "kube-apiserver"
                self._for_a_while(
                    fault,
                    lambda: components.pause(component),
                    lambda: components.resume(component),
                )
                components.wait_ready()
            elif components is not None and fault.kind.startswith("restart-"):
                component = "etcd" if fault.kind == "restart-etcd" else "kube-apiserver"
                components.restart(component)
                fault.cleared = components.wait_ready()
                fault.detail = f"back after {fault.cleared - fault.fired:.1f}s"
                return
            else:
                raise ValueError(f"cannot inject {fault.kind} here")
        except Exception as error:  # noqa: BLE001 - reported per fault, the trial goes on
            fault.error = f"{type(error).__name__}: {error}"
        finally:
            if not fault.cleared:
                fault.cleared = time.monotonic()

    def _for_a_while(
        self, fault: Fault, start: Callable[[], None], end: Callable[[], None]
    ) -> None:
        """`start` the fault, and `end` it 2s to ttl + 4s later (the seconds in its detail)."""
        seconds = self.random.uniform(2, self.settings.ttl + 4)
        fault.detail = f"{seconds:.1f}s"
        start()
        try:
            time.sleep(seconds)
        finally:
            end()

    def _frozen(self, pids: list[int], seconds: float, then: Sequence[int] = ()) -> None:
        """SIGSTOP `pids` and `then`; after `seconds` SIGCONT `pids`, and `then` 0.3s later."""
        signal_all([*pids, *then], signal.SIGSTOP)
        try:
            time.sleep(seconds)
            signal_all(pids, signal.SIGCONT)
            if then:
                time.sleep(0.3)
        finally:
            signal_all([*pids, *then], signal.SIGCONT)


def _through(url: str, port: int) -> str:
    """`url` with its port replaced by the proxy's (on the same loopback host)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit(":", 1)[0] + f":{port}"
    return parts._replace(netloc=netloc).geturl()


@dataclass
class _Start:
    pid: int
    run: int
    token: int
    start: float
    last_seen: float
    ended: bool = False
    tick: str = ""


class EventsFile:
    """The work units' shared JSON-lines file, read on from where the last read ended."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new_events(self) -> list[dict[str, Any]]:
        """The complete lines written since the last call (a line being written waits)."""
        if not self.path.exists():
            return []
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return [json.loads(line) for line in complete.splitlines()]


class _TrialState:
    """What the work units wrote, and when the checker last saw each one alive."""

    def __init__(self, path: Path) -> None:
        self.events = EventsFile(path)
        self.starts: list[_Start] = []
        self.counts: collections.Counter[str] = collections.Counter()

    def read(self) -> None:
        for event in self.events.new_events():
            self.counts[event["event"]] += 1
            if event["event"] == "start":
                self.starts.append(
                    _Start(
                        event["pid"],
                        event["run"],
                        event["token"],
                        event["mono"],
                        event["mono"],
                        tick=event.get("tick", ""),
                    )
                )
            elif event["event"] in {"end", "stopped"}:
                for start in self.starts:
                    if start.pid == event["pid"]:
                        start.ended = True
                        start.last_seen = max(start.last_seen, event["mono"])

    def observe(self, now: float) -> None:
        for start in self.starts:
            if not start.ended:
                if alive(start.pid):
                    start.last_seen = now
                else:
                    start.ended = True

    def tally(self, counts: Counts, faults: Sequence[Fault]) -> None:
        """Read the last events into `counts`, and each fault's recovery into it."""
        self.read()
        counts.runs = len(self.starts)
        counts.completed = self.counts["end"]
        counts.stopped = self.counts["stopped"]
        counts.overlaps = self.counts["overlap"]
        counts.refused = self.counts["refused"]
        for fault in faults:
            fault.recovery = self.recovery(fault)

    @property
    def running(self) -> list[_Start]:
        return [start for start in self.starts if not start.ended]

    def recovery(self, fault: Fault) -> float | None:
        """Seconds from when the lock was free of the fault's effects to the next start.

        The lock is free of it once the fault is cleared and every work unit that started
        before was last seen alive; None while no work unit has started since.
        """
        if not fault.cleared:
            return None
        earlier = [start for start in self.starts if start.start <= fault.cleared]
        free_from = max([fault.cleared, *(start.last_seen for start in earlier)])
        later = [start.start for start in self.starts if start.start > fault.cleared]
        if not later:
            return None
        return max(0.0, min(later) - free_from)


# --- command line ---------------------------------------------------------------------------
def add_common_arguments(parser: argparse.ArgumentParser, env_dir: Path) -> None:
    """--seed, --env-dir, --keep-controlplane and --output, as both checkers take them."""
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--env-dir", type=Path, default=env_dir)
    parser.add_argument("--keep-controlplane", action="store_true")
    parser.add_argument("--output", type=Path, default=None, help="also write the JSON here")


def fault_list(text: str) -> list[str]:
    """`--faults`: comma-separated kinds, or 'none'."""
    return [] if text == "none" else [kind for kind in text.split(",") if kind]


def seed_of(seed: int | None) -> int:
    """The given seed, or a random one (printed in the report, so a run can be replayed)."""
    return seed if seed is not None else secrets.randbelow(2**31)


def publish(report: dict[str, Any], output: Path | None) -> None:
    """The report as JSON on stdout, and in `output` if given."""
    text = json.dumps(report, indent=2)
    print(text)
    if output is not None:
        output.write_text(text + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.reliability.checker", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--contenders", type=int, default=4)
    parser.add_argument("--faults-per-trial", type=int, default=2)
    parser.add_argument(
        "--faults",
        default=",".join(GUARANTEED_FAULTS),
        help=f"comma-separated, from {', '.join(ALL_FAULTS)}, or 'none' "
        f"(default: every fault inside the guarantee; add {FREEZE} or {CLOCK_AHEAD} to see "
        "what fencing is for)",
    )
    parser.add_argument("--ttl", type=float, default=6.0)
    parser.add_argument("--renew", type=float, default=1.0)
    parser.add_argument("--skew", type=float, default=2.0)
    parser.add_argument("--slack", type=float, default=4.0)
    parser.add_argument(
        "--clock-spread",
        type=float,
        default=1.5,
        help="each contender's wall clock is off by a random amount in [-S/2, +S/2] "
        "(default 1.5; must stay under skew + ttl/3 - kill grace)",
    )
    parser.add_argument(
        "--runs-per-trial", type=int, default=4, help="runs per trial (with --ticks: ticks)"
    )
    parser.add_argument(
        "--ticks",
        action="store_true",
        help="tick mode: a new tick every --tick-spacing seconds, each given to --contenders "
        "`run --tick` processes; counts ticks worked twice and ticks lost",
    )
    parser.add_argument("--tick-spacing", type=float, default=1.5)
    parser.add_argument("--tick-stagger", type=float, default=0.5)
    parser.add_argument(
        "--policy",
        choices=("wait", "replace"),
        default="wait",
        help="the contenders' policy (replace: each new contender stops the holder's work)",
    )
    parser.add_argument(
        "--store",
        choices=("lease", "redis", "postgres"),
        default="lease",
        help="where the lock is: the Lease (default), or Redis or PostgreSQL started here "
        f"(then the default faults are {', '.join(STORE_GUARANTEED_FAULTS)})",
    )
    parser.add_argument(
        "--ha",
        action="store_true",
        help="an HA control plane (3 etcd members, 2 API servers behind a balancer; its own "
        f"--env-dir by default), whose default faults are {', '.join(HA_GUARANTEED_FAULTS)}",
    )
    add_common_arguments(parser, ROOT / ".testenv" / "reliability")
    args = parser.parse_args(argv)
    if args.store != "lease" and args.faults == ",".join(GUARANTEED_FAULTS):
        args.faults = ",".join(STORE_GUARANTEED_FAULTS)
    if args.ha:
        if args.store != "lease":
            parser.error("--ha: the lock is the Lease (the control plane holds no store lock)")
        if args.faults == ",".join(GUARANTEED_FAULTS):
            args.faults = ",".join(HA_GUARANTEED_FAULTS)
        if args.env_dir == ROOT / ".testenv" / "reliability":
            args.env_dir = ROOT / ".testenv" / "reliability-ha"
    faults = fault_list(args.faults)
    seed = seed_of(args.seed)
    settings = Settings(
        ttl=args.ttl,
        renew=args.renew,
        skew=args.skew,
        slack=args.slack,
        clock_spread=args.clock_spread,
        contenders=args.contenders,
        runs_per_trial=args.runs_per_trial,
        policy=args.policy,
        # Tick mode: work shorter than the spacing, so that a tick's work ends before the
        # next tick unless a fault holds the lock.
        work=(0.3, 1.0) if args.ticks else Settings.work,
        ticks=args.ticks,
        tick_spacing=args.tick_spacing,
        tick_stagger=args.tick_stagger,
    )
    with ExitStack() as stack:
        cluster = stack.enter_context(
            own_controlplane(args.env_dir, args.keep_controlplane, ha=args.ha)
        )
        store = None
        if args.store != "lease":
            store = (args.store, stack.enter_context(running(args.store)))
        checker = Checker(
            cluster,
            args.env_dir / "checker",
            settings,
            faults,
            seed,
            log=lambda line: print(line, file=sys.stderr, flush=True),
            store=store,
        )
        report = checker.run(args.trials, args.faults_per_trial)
    publish(report, args.output)
    ok = report["overlaps"] == 0 and report["delayed"] == 0 and report["timed_out_trials"] == 0
    if report["ticks"] is not None:
        ok = ok and report["ticks"]["worked_twice"] == 0
        ok = ok and report["ticks"]["lost_while_healthy"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
