"""Mutual-exclusion checker with real pods: injected Jobs run by the e2e pod runner.

Each trial creates one annotated CronJob, lets the real operator inject it, and keeps
several Jobs made from it alive (as `kubectl create job --from=cronjob/...` makes them),
a new one whenever one ends. The pod runner (tests/e2e/podrunner.py) runs their pods:
the real `cronlock-sidecar hold` and `gate`, and a main container that is the checker's
work unit (tests/reliability/checker.py `WORK`): a non-blocking `flock` held for its
whole life (a failed one is an overlap, counted without clocks), start/end records and
fenced writes. Faults hit the pod's processes, the API server and the operator.

    .venv/bin/python -m tests.reliability.pods --trials 14 --seed 1

starts its own control plane under .testenv/reliability-pods, installs the chart's RBAC,
runs the operator and the pod runner, and prints a JSON report. Needs root, like the
e2e tests (one network and mount namespace per pod).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import secrets
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import urllib3

from cronlock_sidecar import contract
from cronlock_sidecar.durations import DurationError, parse_duration
from tests.conftest import ControlPlane, make_service_account_kubeconfig
from tests.e2e.podrunner import PodRunner, PodWorker, ProcessRecord
from tests.kube import job_from_cronjob
from tests.operator_process import OperatorProcess, install_chart_rbac, render_chart
from tests.reliability.checker import (
    TICK,
    WORK,
    Counts,
    Fault,
    _Start,
    _TrialState,
    add_common_arguments,
    fault_list,
    fault_rows,
    own_controlplane,
    publish,
    seed_of,
)
from tests.reliability.faults import ControlPlaneProcesses, signal_all

ROOT = Path(__file__).resolve().parents[2]
NEVER = "0 0 1 1 *"
MAIN = "main"
POD_USER = 65532
API_ERRORS = (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError)

# Faults on one pod's processes, and on the control plane and the operator.
POD_PROCESS_FAULTS = ("kill-sidecar", "stop-sidecar", "kill-main", "delete-pod", "node-loss")
CONTROL_FAULTS = ("pause-apiserver", "kill-operator")
POD_FAULTS = POD_PROCESS_FAULTS + CONTROL_FAULTS
# While these run the API server may not answer: no Job is created meanwhile.
API_AWAY = frozenset({"pause-apiserver"})


@dataclass(frozen=True)
class PodSettings:
    """Timings of the injected CronJob and the trial; ttl and renew are whole seconds."""

    ttl: int = 13  # the operator's minimum with the default 2s skew (docs/DECISIONS.md)
    renew: int = 2
    skew: float = float(contract.DEFAULT_SKEW_SECONDS)
    # As checker.py: the contenders' 1s retry, process start, a loaded 2-core machine.
    slack: float = 4.0
    contenders: int = 3
    runs_per_trial: int = 3
    work: tuple[float, float] = (3.0, 6.0)
    wait_timeout: int = 60
    trial_timeout: float = 240.0
    # How long a restarted operator may take to bring the CronJob to what it asks for.
    settle_timeout: float = 30.0
    # kill-operator: SIGKILL this long (uniform from 0) after the patch that starts a reconcile.
    # The operator re-injects within about 20-25 ms here: a 0.03s window lands most kills
    # before its patch (mid-reconcile), the rest just after it (a restart). Measured: 0.1s
    # landed 0 of 8 before the patch, 0.03s 7 of 10.
    operator_kill_window: float = 0.03
    # A Job whose pod the runner has not started after this is given up.
    pod_timeout: float = 60.0

    @property
    def ttls(self) -> tuple[int, int]:
        """kill-operator flips cronlock.io/ttl between these two, forcing a real patch."""
        return self.ttl, self.ttl + 1

    @property
    def recovery_bound(self) -> float:
        """Longest a lock may stay unused after a fault: the longer ttl + skew + slack."""
        return max(self.ttls) + self.skew + self.slack


@dataclass
class PodFault(Fault):
    """A checker fault, plus what was wrong with the CronJob after a kill-operator."""

    problems: list[str] = field(default_factory=list)
    # kill-operator: the kill landed before the operator's patch was visible (mid-reconcile).
    before_patch: bool = False

    @property
    def corrupted(self) -> bool:
        return bool(self.problems)


@dataclass
class Contender:
    """One Job made from the trial's CronJob and the pod the runner runs for it."""

    job: str
    created: float
    worker: PodWorker | None = None
    done: bool = False
    outcome: str = ""


@dataclass
class PodTrial(Counts):
    index: int
    faults: list[PodFault]
    jobs: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    # Jobs that could not be made because the CronJob was not fully injected.
    bad_templates: list[str] = field(default_factory=list)


# --- what a consistent injection is ------------------------------------------------------------


def injection_problems(cronjob: Mapping[str, Any]) -> list[str]:
    """What is half-done in an injected CronJob: every injected piece must be there once.

    The notion of tests/integration/test_operator.py's operator-killed-mid-burst test: the
    sidecar and the gate first and once each, our podFailurePolicy rule first and once, the
    run-dir volume once and mounted once (read-only) in each container with its /held
    probe, restartPolicy Never, and the lock label on the Job and pod templates.
    """
    problems: list[str] = []
    annotations = (cronjob.get("metadata") or {}).get("annotations") or {}
    lock = annotations.get(contract.ANNOTATION_LOCK) or (cronjob.get("metadata") or {}).get("name")
    job_template = (cronjob.get("spec") or {}).get("jobTemplate") or {}
    job_spec = job_template.get("spec") or {}
    pod_template = job_spec.get("template") or {}
    pod_spec = pod_template.get("spec") or {}
    names = [str(c.get("name")) for c in pod_spec.get("initContainers") or []]
    if names[:2] != [contract.SIDECAR_CONTAINER, contract.GATE_CONTAINER]:
        problems.append(f"init containers {names}")
    for name in (contract.SIDECAR_CONTAINER, contract.GATE_CONTAINER):
        if names.count(name) > 1:
            problems.append(f"init container {name} {names.count(name)} times")
    rules = (job_spec.get("podFailurePolicy") or {}).get("rules") or []
    ours = [
        index
        for index, rule in enumerate(rules)
        if (rule.get("onExitCodes") or {}).get("containerName") == contract.GATE_CONTAINER
    ]
    if ours != [0]:
        problems.append(f"podFailurePolicy rules for {contract.GATE_CONTAINER} at {ours}")
    volumes = [v.get("name") for v in pod_spec.get("volumes") or []]
    if volumes.count(contract.VOLUME_NAME) != 1:
        problems.append(
            f"volume {contract.VOLUME_NAME} {volumes.count(contract.VOLUME_NAME)} times"
        )
    if pod_spec.get("restartPolicy") != "Never":
        problems.append(f"restartPolicy {pod_spec.get('restartPolicy')}")
    for container in pod_spec.get("containers") or []:
        mounts = [
            m for m in container.get("volumeMounts") or [] if m.get("name") == contract.VOLUME_NAME
        ]
        if len(mounts) != 1 or not mounts[0].get("readOnly"):
            problems.append(f"container {container.get('name')}: run-dir mounts {mounts}")
        probe = (container.get("livenessProbe") or {}).get("httpGet") or {}
        if probe.get("path") != contract.HELD_PATH:
            problems.append(f"container {container.get('name')}: no {contract.HELD_PATH} probe")
    for what, template in (("Job", job_template), ("pod", pod_template)):
        labels = (template.get("metadata") or {}).get("labels") or {}
        if labels.get(contract.LABEL_LOCK) != lock:
            problems.append(
                f"{what} template label {contract.LABEL_LOCK}={labels.get(contract.LABEL_LOCK)}"
            )
    return problems


def stale_settings(cronjob: Mapping[str, Any]) -> list[str]:
    """Where the injected sidecar does not (yet) say what the annotations ask: the ttl."""
    annotations = (cronjob.get("metadata") or {}).get("annotations") or {}
    wanted = annotations.get(contract.ANNOTATION_TTL)
    pod_spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    sidecars = [
        c
        for c in pod_spec.get("initContainers") or []
        if c.get("name") == contract.SIDECAR_CONTAINER
    ]
    if not sidecars or wanted is None:
        return [] if wanted is None else ["no sidecar"]
    env = {item["name"]: item.get("value") for item in sidecars[0].get("env") or []}
    injected = env.get(contract.ENV_TTL)
    try:
        same = injected is not None and parse_duration(injected) == parse_duration(wanted)
    except DurationError:
        same = False
    return [] if same else [f"sidecar {contract.ENV_TTL}={injected}, annotation ttl {wanted}"]


def plan_faults(
    faults: Sequence[str], trials: int, per_trial: int, rng: random.Random
) -> list[list[str]]:
    """Every fault kind as evenly as `trials * per_trial` slots allow, in random order."""
    if not faults:
        return [[] for _ in range(trials)]
    kinds = [faults[i % len(faults)] for i in range(trials * per_trial)]
    rng.shuffle(kinds)
    return [kinds[i * per_trial : (i + 1) * per_trial] for i in range(trials)]


def outcome(worker: PodWorker | None) -> str:
    """How a contender's pod ended, for the report: its gate's decision, its work's exit."""
    if worker is None:
        return "no-pod"
    if worker.interrupt == "dropped":
        return "node-lost"
    codes = {c.name: c for c in worker.containers}
    gate = codes.get(contract.GATE_CONTAINER)
    gate_code = gate.exit_code() if gate is not None else None
    if gate_code is None:
        return "deleted-before-decision" if worker.interrupt == "deleted" else "no-decision"
    if gate_code == contract.EXIT_SKIPPED:
        return "skipped"
    if gate_code == contract.EXIT_UNAVAILABLE:
        return "unavailable"
    if gate_code != 0:
        return f"gate-{gate_code}"
    main = codes.get(MAIN)
    code = main.exit_code() if main is not None else None
    by = f" ({main.killed_by})" if main is not None and main.killed_by else ""
    return f"main-{code}{by}"


# --- the checker -------------------------------------------------------------------------------


class PodChecker:
    """Runs pod-mode trials in `namespace` with a running operator and pod runner."""

    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        runner: PodRunner,
        operator: OperatorProcess,
        namespace: str,
        settings: PodSettings,
        faults: Sequence[str],
        seed: int,
        components: ControlPlaneProcesses | None,
        workdir: Path | None = None,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        unknown = set(faults) - set(POD_FAULTS)
        if unknown:
            raise ValueError(f"unknown faults: {', '.join(sorted(unknown))}")
        if components is None and "pause-apiserver" in faults:
            raise ValueError("pause-apiserver needs the local control plane (tests/controlplane)")
        self.api = api
        self.batch = kubernetes.client.BatchV1Api(api)
        self.core = kubernetes.client.CoreV1Api(api)
        self.runner = runner
        self.operator = operator
        self.namespace = namespace
        self.settings = settings
        self.faults = list(faults)
        self.seed = seed
        self.random = random.Random(seed)  # noqa: S311 - reproducible fault schedules
        self.components = components
        self.mark = secrets.token_hex(4)
        # Pods run as POD_USER: every directory above the trial's files must let it through.
        base = workdir or Path(tempfile.mkdtemp(prefix="cronlock-pods-"))
        self.workdir = base / f"{time.strftime('%Y%m%dT%H%M%S')}-{self.mark}"
        self.log = log
        self.trials: list[PodTrial] = []
        self._cronjob = ""

    # --- the whole run ------------------------------------------------------------------------
    def run(self, trials: int, faults_per_trial: int = 2) -> dict[str, Any]:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workdir.parent.chmod(0o755)
        self.workdir.chmod(0o755)
        self.runner.serve(self.namespace)
        started = time.monotonic()
        bound = self.settings.recovery_bound
        for index, kinds in enumerate(
            plan_faults(self.faults, trials, faults_per_trial, self.random)
        ):
            try:
                trial = self._trial(index, kinds)
            finally:
                if self.components is not None:
                    self.components.resume_all()
                if self.operator.process is None:
                    self.operator.start()
            self.trials.append(trial)
            recoveries = [fault.summary(bound)["recovery_s"] for fault in trial.faults]
            details = [fault.error or fault.detail for fault in trial.faults]
            self.log(
                f"trial {index}: faults {','.join(kinds) or '-'} {details} runs {trial.runs} "
                f"jobs {trial.jobs} overlaps {trial.overlaps} refused {trial.refused} "
                f"recovery {recoveries} {'TIMED OUT ' if trial.timed_out else ''}"
                f"{trial.seconds:.1f}s"
            )
        return self.report(time.monotonic() - started)

    def report(self, seconds: float) -> dict[str, Any]:
        """checker.py's report, plus corrupted CronJobs and how each pod ended."""
        bound = self.settings.recovery_bound
        faults = [fault for trial in self.trials for fault in trial.faults]
        by_kind = fault_rows(self.trials, bound)
        for kind, row in by_kind.items():
            mine = [fault for fault in faults if fault.kind == kind]
            row["corrupted_cronjobs"] = sum(fault.corrupted for fault in mine)
            row["killed_before_the_patch"] = sum(fault.before_patch for fault in mine)
            row["details"] = [fault.detail for fault in mine]
        outcomes: collections.Counter[str] = collections.Counter()
        for trial in self.trials:
            outcomes.update(trial.outcomes)
        return {
            "seed": self.seed,
            "settings": {**asdict(self.settings), "recovery_bound_s": bound},
            "trials": len(self.trials),
            "faults": len(faults),
            "runs": sum(t.runs for t in self.trials),
            "jobs": sum(t.jobs for t in self.trials),
            "completed_runs": sum(t.completed for t in self.trials),
            "stopped_runs": sum(t.stopped for t in self.trials),
            "overlaps": sum(t.overlaps for t in self.trials),
            "overlaps_outside_guarantee": 0,  # every pod-mode fault is inside the guarantee
            "refused_stale_writes": sum(t.refused for t in self.trials),
            "delayed": sum(f.summary(bound)["delayed"] for f in faults),
            "timed_out_trials": sum(t.timed_out for t in self.trials),
            "fault_errors": sum(bool(f.error) for f in faults),
            "corrupted_cronjobs": sum(f.corrupted for f in faults)
            + sum(len(t.bad_templates) for t in self.trials),
            "pod_outcomes": dict(sorted(outcomes.items())),
            "by_fault": by_kind,
            "seconds": round(seconds, 1),
        }

    # --- one trial ----------------------------------------------------------------------------
    def _trial(self, index: int, kinds: list[str]) -> PodTrial:
        directory = self.workdir / f"trial-{index:03d}"
        directory.mkdir()
        directory.chmod(0o777)
        for name in ("flock", "events.jsonl", "fencing-store"):
            (directory / name).touch()
            (directory / name).chmod(0o666)
        trial = PodTrial(index, [PodFault(kind, index) for kind in kinds])
        state = _TrialState(directory / "events.jsonl")
        self._cronjob = f"pods-{self.mark}-{index}"
        self._create_cronjob(self._cronjob, directory)
        contenders: list[Contender] = []
        threads: list[tuple[PodFault, threading.Thread]] = []
        pending = list(trial.faults)
        targeted: set[int] = set()
        next_fault: tuple[int, float] | None = None  # (work unit, when)
        spawn_after = 0.0
        started = time.monotonic()
        deadline = started + self.settings.trial_timeout
        try:
            while True:
                now = time.monotonic()
                state.read()
                state.observe(now)
                self._update(contenders, now)
                busy = [fault for fault, thread in threads if thread.is_alive()]
                alive = [c for c in contenders if not c.done]
                api_away = any(fault.kind in API_AWAY for fault in busy)
                enough = self._enough(state, trial, pending, busy)
                if (
                    len(alive) < self.settings.contenders
                    and not enough
                    and not api_away
                    and now >= spawn_after
                ):
                    contender = self._spawn(trial, directory)
                    if contender is None:
                        spawn_after = now + 1.0
                    else:
                        contenders.append(contender)
                        spawn_after = now + 0.3
                # Each fault hits a work unit no earlier fault has hit.
                fresh = [start for start in state.running if start.pid not in targeted]
                if pending and fresh and not busy:
                    holder = fresh[-1]
                    if next_fault is None or next_fault[0] != holder.pid:
                        at = holder.start + self.random.uniform(0.2, 1.0)
                        next_fault = (holder.pid, at)
                    elif now >= next_fault[1]:
                        fault = pending.pop(0)
                        thread = threading.Thread(
                            target=self._inject, args=(fault, holder), daemon=True
                        )
                        thread.start()
                        threads.append((fault, thread))
                        targeted.add(holder.pid)
                        next_fault = None
                if enough and not state.running:
                    break
                if now >= deadline:
                    trial.timed_out = True
                    break
                time.sleep(TICK)
        finally:
            for _, thread in threads:
                thread.join(timeout=90)
            if self.components is not None:
                self.components.resume_all()
            if self.operator.process is None:
                self.operator.start()
            self._stop(contenders)
        state.tally(trial, trial.faults)
        trial.jobs = len(contenders)
        for contender in contenders:
            name = contender.outcome or outcome(contender.worker)
            trial.outcomes[name] = trial.outcomes.get(name, 0) + 1
        trial.seconds = time.monotonic() - started
        return trial

    def _enough(
        self, state: _TrialState, trial: PodTrial, pending: list[PodFault], busy: list[PodFault]
    ) -> bool:
        """Enough work-unit starts, every fault injected and cleared, and a start after each."""
        if pending or busy or len(state.starts) < self.settings.runs_per_trial:
            return False
        return all(state.recovery(fault) is not None for fault in trial.faults)

    def _create_cronjob(self, name: str, directory: Path) -> None:
        settings = self.settings
        work = [
            sys.executable, "-c", WORK,
            str(directory / "flock"), str(directory / "events.jsonl"),
            str(directory / "fencing-store"), f"{settings.work[0]:.2f}",
        ]  # fmt: skip
        body = {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {
                "name": name,
                "annotations": {
                    contract.ANNOTATION_ENABLED: "true",
                    contract.ANNOTATION_TTL: f"{settings.ttl}s",
                    contract.ANNOTATION_RENEW: f"{settings.renew}s",
                    contract.ANNOTATION_POLICY: "wait",
                    contract.ANNOTATION_WAIT_TIMEOUT: f"{settings.wait_timeout}s",
                },
            },
            "spec": {
                "schedule": NEVER,
                "jobTemplate": {
                    "spec": {
                        "backoffLimit": 0,
                        "template": {
                            "spec": {
                                "restartPolicy": "Never",
                                "securityContext": {
                                    "runAsNonRoot": True,
                                    "runAsUser": POD_USER,
                                    "seccompProfile": {"type": "RuntimeDefault"},
                                },
                                "containers": [
                                    {
                                        "name": MAIN,
                                        "image": "python:3.11-slim",
                                        "command": work,
                                        "securityContext": {
                                            "allowPrivilegeEscalation": False,
                                            "capabilities": {"drop": ["ALL"]},
                                        },
                                    }
                                ],
                            }
                        },
                    }
                },
            },
        }
        self.batch.create_namespaced_cron_job(self.namespace, body, _request_timeout=30)
        deadline = time.monotonic() + self.settings.settle_timeout
        while time.monotonic() < deadline:
            if not injection_problems(self._read_cronjob(name)):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the operator did not inject CronJob {name}")

    def _read_cronjob(self, name: str) -> dict[str, Any]:
        raw = self.batch.read_namespaced_cron_job(
            name, self.namespace, _request_timeout=10, _preload_content=False
        )
        result: dict[str, Any] = json.loads(raw.data)
        return result

    def _spawn(self, trial: PodTrial, directory: Path) -> Contender | None:
        """`kubectl create job --from=cronjob/...`, with a random work duration; None if not now."""
        name = f"{self._cronjob}-{trial.jobs + 1}"
        try:
            cronjob = self._read_cronjob(self._cronjob)
            problems = injection_problems(cronjob)
            if problems:
                trial.bad_templates.append(f"{name}: {'; '.join(problems)}")
                return None
            body = job_from_cronjob(cronjob, name)
            main = body["spec"]["template"]["spec"]["containers"][0]
            main["command"][-1] = f"{self.random.uniform(*self.settings.work):.2f}"
            self.batch.create_namespaced_job(
                self.namespace, body, _request_timeout=10, _preload_content=False
            )
        except API_ERRORS as error:
            self.log(f"cannot create Job {name} now: {type(error).__name__}")
            return None
        trial.jobs += 1
        return Contender(name, time.monotonic())

    def _update(self, contenders: list[Contender], now: float) -> None:
        """A contender is done once the runner has finished its pod (or never got one)."""
        waiting = [c for c in contenders if not c.done and c.worker is None]
        if waiting:
            workers = {w.job: w for w in self.runner.pods(self.namespace)}
            for contender in waiting:
                contender.worker = workers.get(contender.job)
        for contender in contenders:
            if contender.done:
                continue
            if contender.worker is None:
                if now - contender.created > self.settings.pod_timeout:
                    contender.done, contender.outcome = True, "no-pod"
            elif contender.worker.finished.is_set():
                contender.done = True

    def _stop(self, contenders: list[Contender]) -> None:
        """Delete the trial's CronJob (its Jobs and Lease go with it) and wait for its pods."""
        for contender in contenders:
            worker = contender.worker
            if worker is not None and not worker.finished.is_set():
                with contextlib.suppress(*API_ERRORS):
                    self.core.delete_namespaced_pod(
                        worker.name, self.namespace, grace_period_seconds=5, _request_timeout=10
                    )
        with contextlib.suppress(*API_ERRORS):
            self.batch.delete_namespaced_cron_job(
                self._cronjob,
                self.namespace,
                propagation_policy="Background",
                _request_timeout=10,
            )
        deadline = time.monotonic() + 30
        for contender in contenders:
            if contender.worker is not None:
                contender.worker.finished.wait(max(0.0, deadline - time.monotonic()))
            if not contender.done:
                # Still deciding or waiting for the lock when the trial had enough.
                contender.done, contender.outcome = True, "stopped-at-trial-end"

    # --- faults -------------------------------------------------------------------------------
    def _inject(self, fault: PodFault, holder: _Start) -> None:
        settings = self.settings
        fault.fired = time.monotonic()
        try:
            record = self._main_record(holder.pid)
            worker = self.runner.worker(self.namespace, record.pod)
            sidecar = next(
                (c for c in worker.containers if c.name == contract.SIDECAR_CONTAINER), None
            )
            hold = sidecar.process.pid if sidecar and sidecar.running and sidecar.process else 0
            fault.holder_cmd, fault.holder_run = holder.pid, hold
            if fault.kind in {"kill-sidecar", "stop-sidecar"} and not hold:
                raise RuntimeError(f"pod {record.pod} has no running sidecar")
            if fault.kind == "kill-sidecar":
                signal_all([hold], signal.SIGKILL)
                fault.detail = record.pod
            elif fault.kind == "stop-sidecar":
                seconds = self.random.uniform(1, settings.ttl + settings.skew + 2)
                signal_all([hold], signal.SIGSTOP)
                try:
                    time.sleep(seconds)
                finally:
                    signal_all([hold], signal.SIGCONT)
                fault.detail = f"{seconds:.1f}s, main {record.killed_by or 'not killed'}"
            elif fault.kind == "kill-main":
                signal_all([holder.pid], signal.SIGKILL)
                fault.detail = record.pod
            elif fault.kind == "delete-pod":
                self.core.delete_namespaced_pod(record.pod, self.namespace, _request_timeout=10)
                fault.detail = record.pod
            elif fault.kind == "node-loss":
                self.runner.drop(self.namespace, record.pod)
                fault.detail = record.pod
            elif fault.kind == "pause-apiserver" and self.components is not None:
                seconds = self.random.uniform(2, settings.ttl + 4)
                fault.detail = f"{seconds:.1f}s"
                self.components.pause("kube-apiserver")
                try:
                    time.sleep(seconds)
                finally:
                    self.components.resume("kube-apiserver")
                self.components.wait_ready()
            elif fault.kind == "kill-operator":
                self._kill_operator(fault)
            else:
                raise ValueError(f"cannot inject {fault.kind} here")
        except Exception as error:  # noqa: BLE001 - reported per fault, the trial goes on
            fault.error = f"{type(error).__name__}: {error}"
        finally:
            if not fault.cleared:
                fault.cleared = time.monotonic()

    def _main_record(self, pid: int) -> ProcessRecord:
        """The runner's record of the work unit: the main container's first process is it."""
        for record in self.runner.processes(self.namespace, MAIN):
            if record.pid == pid and record.running:
                return record
        raise RuntimeError(f"work unit {pid} is not a running main container of the runner")

    def _kill_operator(self, fault: PodFault) -> None:
        """Change the ttl, SIGKILL the operator soon after, start it, check the CronJob."""
        name = self._cronjob
        before = self._read_cronjob(name)
        current = (before["metadata"].get("annotations") or {}).get(contract.ANNOTATION_TTL)
        low, high = self.settings.ttls
        ttl = high if current == f"{low}s" else low
        delay = self.random.uniform(0.0, self.settings.operator_kill_window)
        self.batch.patch_namespaced_cron_job(
            name,
            self.namespace,
            {"metadata": {"annotations": {contract.ANNOTATION_TTL: f"{ttl}s"}}},
            _content_type="application/merge-patch+json",
            _request_timeout=10,
            _preload_content=False,
        )
        time.sleep(delay)
        self.operator.kill()
        at_kill = self._read_cronjob(name)
        reinjected = not stale_settings(at_kill)
        fault.before_patch = not reinjected
        fault.problems += [f"at the kill: {problem}" for problem in injection_problems(at_kill)]
        restarted = time.monotonic()
        self.operator.start()
        settled_after = self._settled(name)
        if settled_after is None:
            last = self._read_cronjob(name)
            fault.problems += [
                f"{self.settings.settle_timeout:g}s after the restart: {problem}"
                for problem in [
                    *injection_problems(last),
                    *stale_settings(last),
                    *self._lease_problems(last),
                ]
            ] or ["not settled"]
        fault.detail = (
            f"ttl {current} -> {ttl}s, killed {delay * 1000:.0f} ms after the patch "
            f"({'already re-injected' if reinjected else 'not yet re-injected'}), consistent "
            + (
                "never"
                if settled_after is None
                else f"{settled_after - restarted:.1f}s after the restart"
            )
        )

    def _settled(self, name: str) -> float | None:
        """When the CronJob was fully and consistently injected; None if not in time."""
        deadline = time.monotonic() + self.settings.settle_timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(*API_ERRORS):
                cronjob = self._read_cronjob(name)
                if not (
                    injection_problems(cronjob)
                    or stale_settings(cronjob)
                    or self._lease_problems(cronjob)
                ):
                    return time.monotonic()
            time.sleep(0.2)
        return None

    def _lease_problems(self, cronjob: Mapping[str, Any]) -> list[str]:
        """The Lease is owned by the CronJob and its pods' holder Role names it."""
        problems: list[str] = []
        metadata = cronjob["metadata"]
        lock = (metadata.get("annotations") or {}).get(contract.ANNOTATION_LOCK, metadata["name"])
        lease_name = contract.lease_name(lock)
        lease = kubernetes.client.CoordinationV1Api(self.api).read_namespaced_lease(
            lease_name, self.namespace, _request_timeout=10, _preload_content=False
        )
        owners = [o["uid"] for o in json.loads(lease.data)["metadata"].get("ownerReferences") or []]
        if owners.count(metadata["uid"]) != 1:
            problems.append(f"lease {lease_name} owners {owners}")
        account = (
            cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"].get("serviceAccountName")
            or "default"
        )
        role = kubernetes.client.RbacAuthorizationV1Api(self.api).read_namespaced_role(
            f"cronlock-holder-{account}",
            self.namespace,
            _request_timeout=10,
            _preload_content=False,
        )
        names = [
            n
            for rule in json.loads(role.data).get("rules") or []
            for n in rule.get("resourceNames") or []
        ]
        if lease_name not in names:
            problems.append(f"role cronlock-holder-{account} does not name {lease_name}")
        return problems


# --- command line ------------------------------------------------------------------------------
@contextmanager
def operator_and_runner(
    kubeconfig: Path, env: dict[str, str], env_dir: Path
) -> Iterator[tuple[kubernetes.client.ApiClient, OperatorProcess, PodRunner]]:
    """The chart's RBAC, the operator as its ServiceAccount, and the pod runner."""
    api = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
    plane = ControlPlane(kubeconfig, env, env_dir)
    try:
        account = install_chart_rbac(api, env)
    except kubernetes.utils.FailToCreateError as error:
        if any(e.status != 409 for e in error.api_exceptions):
            raise
        account = next(
            d["metadata"]["name"] for d in render_chart(env) if d["kind"] == "ServiceAccount"
        )
    operator_kubeconfig = make_service_account_kubeconfig(
        plane, api, "cronlock-system", account, env_dir
    )
    operator = OperatorProcess(operator_kubeconfig, env_dir / "pods-operator.log", env)
    operator.start()
    runner = PodRunner(kubeconfig, env_dir / "podrunner-pods")
    try:
        runner.start()
        yield api, operator, runner
    finally:
        runner.stop()
        operator.stop()
        api.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.reliability.pods", description=__doc__.splitlines()[0]
    )
    defaults = PodSettings()
    parser.add_argument("--trials", type=int, default=14)
    parser.add_argument("--faults-per-trial", type=int, default=2)
    parser.add_argument(
        "--faults",
        default=",".join(POD_FAULTS),
        help=f"comma-separated, from {', '.join(POD_FAULTS)}, or 'none' (default: all)",
    )
    parser.add_argument("--contenders", type=int, default=defaults.contenders)
    parser.add_argument("--runs-per-trial", type=int, default=defaults.runs_per_trial)
    parser.add_argument("--ttl", type=int, default=defaults.ttl)
    parser.add_argument("--renew", type=int, default=defaults.renew)
    parser.add_argument("--slack", type=float, default=defaults.slack)
    parser.add_argument(
        "--operator-kill-window",
        type=float,
        default=defaults.operator_kill_window,
        help="kill-operator: SIGKILL up to this many seconds after the patch (default 0.03)",
    )
    add_common_arguments(parser, ROOT / ".testenv" / "reliability-pods")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("needs root: every pod gets its own network and mount namespaces")
    faults = fault_list(args.faults)
    # Volume sources are bind-mounted from inside the pods, whose cwd is /: absolute only.
    env_dir = args.env_dir.resolve()
    seed = seed_of(args.seed)
    settings = PodSettings(
        ttl=args.ttl,
        renew=args.renew,
        slack=args.slack,
        operator_kill_window=args.operator_kill_window,
        contenders=args.contenders,
        runs_per_trial=args.runs_per_trial,
    )

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    # SIGTERM unwinds like Ctrl-C: pods, operator and control plane are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    namespace = f"cronlock-pods-{secrets.token_hex(3)}"
    with (
        own_controlplane(env_dir, args.keep_controlplane) as cluster,
        operator_and_runner(cluster.kubeconfig, cluster.env, env_dir) as (
            api,
            operator,
            runner,
        ),
    ):
        kubernetes.client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
        checker = PodChecker(
            api,
            runner,
            operator,
            namespace,
            settings,
            faults,
            seed,
            cluster.components(),
            log=log,
        )
        log(f"seed {seed}; work units' files under {checker.workdir}")
        report = checker.run(args.trials, args.faults_per_trial)
    publish(report, args.output)
    ok = (
        report["overlaps"] == 0
        and report["delayed"] == 0
        and report["timed_out_trials"] == 0
        and report["corrupted_cronjobs"] == 0
        and report["fault_errors"] == 0
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
