"""Mutual-exclusion checker with real pods on a real node: injected Jobs, faults from the host.

Each trial creates one annotated CronJob, lets the real operator inject it, and keeps
several Jobs made from it alive (as `kubectl create job --from=cronjob/...` makes them),
a new one whenever one ends. Their pods run on the real node (kubelet, containerd, runc:
tests/controlplane/node): the injected `cronlock-sidecar hold` and `gate` from the image
built from our Dockerfile, the `/held` liveness probe, and a main container that is the
checker's work unit (`WORK`): `sh` as PID 1, which ignores SIGTERM as such a shell does,
runs a Python process that

- connects to the work tracker on the host (tests/support/node.py) first: the host sees the
  work start, and stop when the kernel closes the connection as the process dies,
  however it dies;
- takes a non-blocking `flock` on a file that every pod of the trial shares through a
  hostPath volume, and holds it for its whole life: a failed `flock` is an overlap,
  counted without clocks;
- records its start and end, and writes its fencing token to a store that refuses tokens
  older than the newest it has seen.

The Leases are watched too: a work's stop is compared with the expiry (last renewTime +
leaseDurationSeconds) of the Lease its pod held, on this host's clock, which the node
shares. Faults hit the holder's pod from the host (its path to the API server cut, its
sidecar frozen or killed, its main container killed, the pod deleted, the kubelet lost),
the API server and the operator. The faults that can make a holder lose its Lease hit a
long work, one that would outlive the Lease if nothing stopped it.

    flock /tmp/cronlock-node.lock .venv/bin/python -m tests.reliability.pods --trials 8

starts its own control plane and node under .testenv/reliability-pods (the e2e fixtures'
code paths), installs the chart's RBAC, runs the operator, and prints a JSON report.
Needs root, like the node.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import secrets
import shlex
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import urllib3

from cronlock_operator.lock.config import (
    InvalidConfig,
    kill_grace_seconds,
    minimum_ttl_seconds,
)
from cronlock_sidecar import contract
from cronlock_sidecar.lock.durations import DurationError, parse_duration
from cronlock_sidecar.lock.model import Timing
from tests.reliability.checker import (
    TICK,
    Cluster,
    Counts,
    EventsFile,
    Fault,
    add_common_arguments,
    components_of,
    fault_list,
    fault_rows,
    own_controlplane,
    publish,
    seed_of,
)
from tests.reliability.faults import ControlPlaneProcesses
from tests.support.controlplane import ControlPlane, make_service_account_kubeconfig
from tests.support.cronjobs import job_from_cronjob, make_cronjob
from tests.support.node import (
    CRONLOCK_IMAGE,
    HOST_LINK_IP,
    LeaseRecorder,
    LeaseVersion,
    PodRecorder,
    RealNode,
    Work,
    WorkTracker,
    container_state,
    exit_code,
    overlapping,
)
from tests.support.operator import (
    SIDECAR_IMAGE,
    OperatorProcess,
    install_chart_rbac,
    render_chart,
)

ROOT = Path(__file__).resolve().parents[2]
NEVER = "0 0 1 1 *"
MAIN = "main"
POD_USER = 65532
API_ERRORS = (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError)
# As the e2e fixture `node_operator` runs it: the image built from our Dockerfile, never pulled.
OPERATOR_ARGS = ("--sidecar-image", SIDECAR_IMAGE, "--sidecar-image-pull-policy", "Never")
# Where the trial's shared directory (a hostPath volume) is mounted in the main container.
SHARED = "/checker"
SHARED_VOLUME = "checker"
SHARED_FILES = ("flock", "events.jsonl", "fencing-store")
FENCING_TOKEN = f"{contract.RUN_DIR}/{contract.FENCING_TOKEN_FILE}"

# Faults on the holder's pod, from the host of the node it runs on.
POD_PROCESS_FAULTS = (
    "cut-pods",
    "stop-sidecar",
    "kill-sidecar",
    "kill-main",
    "delete-pod",
    "node-loss",
)
# Faults on the holder's node, as a cluster of many nodes sees them (issue 25): the node
# cut off from the API server with its kubelet alive, its containerd crashed and
# restarted, the holder evicted (Eviction API), preempted by the scheduler for a pod of a
# higher priority, or its node drained, its Node deleted.
NODE_FAULTS = ("partition", "restart-containerd", "evict", "preempt", "drain", "delete-node")
# preempt: the preemptor's PriorityClass (cluster-scoped, created once, kept).
PREEMPTOR_PRIORITY_CLASS = "cronlock-checker-preemptor"
CONTROL_FAULTS = ("pause-apiserver", "kill-operator")
POD_FAULTS = POD_PROCESS_FAULTS + NODE_FAULTS + CONTROL_FAULTS
# While these run the API server may not answer: no Job is created meanwhile.
API_AWAY = frozenset({"pause-apiserver"})
# These hit a long work, one that would outlive its Lease if nothing stopped it: only then
# does its stop, compared with the Lease's expiry, show that the sidecar stopped it in time.
LONG_WORK_FAULTS = frozenset(
    {"cut-pods", "stop-sidecar", "kill-sidecar", "node-loss", "pause-apiserver", "partition"}
)

WORK = textwrap.dedent(
    """
    import fcntl, json, os, socket, sys, time
    shared, token_path, host, port, seconds = sys.argv[1:6]
    pod = os.environ["HOSTNAME"]
    # First the tracker: it sees this work from now until the kernel closes the connection,
    # when this process dies, however it dies.
    tracker = socket.create_connection((host, int(port)), timeout=10)
    tracker.sendall((pod + "\\n").encode())
    token = int(open(token_path).read())
    def record(event, **fields):
        line = json.dumps({"event": event, "pod": pod, "token": token,
                           "mono": time.monotonic(), **fields})
        fd = os.open(os.path.join(shared, "events.jsonl"), os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, (line + "\\n").encode())
        finally:
            os.close(fd)
    def fenced_write(stage):
        with open(os.path.join(shared, "fencing-store"), "a+") as store:
            fcntl.flock(store, fcntl.LOCK_EX)
            store.seek(0)
            highest = max([int(word) for word in store.read().split()] or [0])
            if token < highest:
                record("refused", stage=stage, highest=highest)
                return
            store.write(f"{token}\\n")
    lock = os.open(os.path.join(shared, "flock"), os.O_RDWR)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        # Another work unit is alive: counted, then work on as the lease holder would.
        record("overlap")
    record("start")
    deadline = time.monotonic() + float(seconds)
    while True:
        fenced_write("work")
        if time.monotonic() >= deadline:
            break
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
    record("end")
    """
)
# `sh` stays PID 1 (a command after the work keeps it from exec'ing Python): like most
# shells there, it ignores SIGTERM, so only a SIGKILL ends a work that must stop.
WORK_SCRIPT = f'python3 -c {shlex.quote(WORK)} "$@"; exit $?'


def work_command(tracker_port: int, seconds: float) -> list[str]:
    """The main container's command: WORK under `sh`; the duration is the last argument."""
    return [
        "sh", "-c", WORK_SCRIPT, "work",
        SHARED, FENCING_TOKEN, HOST_LINK_IP, str(tracker_port), f"{seconds:.2f}",
    ]  # fmt: skip


@dataclass(frozen=True)
class PodSettings:
    """Timings of the injected CronJob and the trial; ttl and renew are whole seconds."""

    # The operator's shortest valid ttl with its default clock skew (cronlock_operator.lock.config).
    ttl: int = minimum_ttl_seconds(contract.DEFAULT_SKEW_SECONDS)
    renew: int = 2
    # The operator's default; it is what the injected sidecars use.
    skew: int = contract.DEFAULT_SKEW_SECONDS
    # Pods start in seconds on the node, and a fault may leave no contender waiting.
    slack: float = 8.0
    contenders: int = 3
    runs_per_trial: int = 3
    work: tuple[float, float] = (3.0, 6.0)
    # Beyond the longer ttl + skew by this much: a long work (LONG_WORK_FAULTS).
    long_work: tuple[float, float] = (4.0, 8.0)
    wait_timeout: int = 60
    trial_timeout: float = 240.0
    # How long a restarted operator may take to bring the CronJob to what it asks for.
    settle_timeout: float = 30.0
    # kill-operator: SIGKILL this long (uniform from 0) after the patch that starts a
    # reconcile; the operator re-injects within about 20-25 ms (docs/RELIABILITY.md).
    operator_kill_window: float = 0.03
    # At a trial's end: how long its pods may take to be gone.
    stop_timeout: float = 60.0

    def __post_init__(self) -> None:
        for ttl in self.ttls:
            try:
                kill_grace_seconds(ttl, self.skew, f"{ttl}s")
            except InvalidConfig as error:
                raise ValueError(str(error)) from None

    @property
    def ttls(self) -> tuple[int, int]:
        """kill-operator flips cronlock.io/ttl between these two, forcing a real patch."""
        return self.ttl, self.ttl + 1

    @property
    def renew_deadline(self) -> float:
        """How long a holder goes on without a successful renewal (2/3 of the ttl)."""
        return Timing.of(self.ttl, skew=self.skew).renew_deadline

    @property
    def kill_grace(self) -> int:
        """The pod's grace the operator injects for this ttl."""
        return kill_grace_seconds(self.ttl, self.skew, f"{self.ttl}s")

    @property
    def long_work_seconds(self) -> tuple[float, float]:
        """A long work outlives the longer ttl + skew: its Lease expires before it ends."""
        beyond = max(self.ttls) + self.skew
        return beyond + self.long_work[0], beyond + self.long_work[1]

    @property
    def recovery_bound(self) -> float:
        """Longest a lock may stay unused after a fault: the longer ttl + skew + slack."""
        return max(self.ttls) + self.skew + self.slack


@dataclass
class PodFault(Fault):
    """A checker fault, the work it hit, and what was wrong with the CronJob afterwards."""

    problems: list[str] = field(default_factory=list)
    # kill-operator: the kill landed before the operator's patch was visible (mid-reconcile).
    before_patch: bool = False
    # The pod whose work the fault hit, how its hold on the Lease ended, and its work's
    # stop minus that Lease's expiry (negative: stopped before the Lease expired).
    holder: str = ""
    lease_end: str = ""
    after_expiry: float | None = None

    @property
    def corrupted(self) -> bool:
        return bool(self.problems)


@dataclass
class Contender:
    """One Job made from the trial's CronJob."""

    job: str
    created: float
    long: bool = False
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
    # Pairs of works whose lives, as the tracker saw them, intersect.
    tracker_overlaps: int = 0
    # Every work's stop minus the expiry of the Lease its pod held.
    after_expiry: list[float] = field(default_factory=list)
    # Works whose pod was never seen holding the Lease (a work without the lock, or a
    # Lease watch that missed it): nothing to compare their stop with.
    works_without_lease: list[str] = field(default_factory=list)
    # Works still running when the trial had stopped its pods.
    leftover_works: int = 0


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


# --- the pure parts: the plan, how a pod ended, the Lease's expiry, recovery -------------------


def plan_faults(
    faults: Sequence[str], trials: int, per_trial: int, rng: random.Random
) -> list[list[str]]:
    """Every fault kind as evenly as `trials * per_trial` slots allow, in random order."""
    if not faults:
        return [[] for _ in range(trials)]
    kinds = [faults[i % len(faults)] for i in range(trials * per_trial)]
    rng.shuffle(kinds)
    return [kinds[i * per_trial : (i + 1) * per_trial] for i in range(trials)]


def outcome(pod: Mapping[str, Any] | None) -> str:
    """How a contender's pod ended, from its last status: its gate's decision, its work's exit."""
    if pod is None:
        return "no-pod"
    deleted = bool((pod.get("metadata") or {}).get("deletionTimestamp"))
    gate = exit_code(dict(pod), contract.GATE_CONTAINER)
    if gate is None:
        return "deleted-before-decision" if deleted else "no-decision"
    if gate == contract.EXIT_SKIPPED:
        return "skipped"
    if gate == contract.EXIT_UNAVAILABLE:
        return "unavailable"
    if gate != 0:
        return f"gate-{gate}"
    state = container_state(dict(pod), MAIN)
    terminated = state.get("terminated")
    if terminated is None:
        return "main-running" if "running" in state else "main-not-started"
    name = f"main-{terminated.get('exitCode')}"
    reason = terminated.get("reason")
    if reason not in (None, "Completed", "Error"):
        name += f" ({reason})"
    return name + (", pod deleted" if deleted and terminated.get("exitCode") != 0 else "")


def job_finished(job: Mapping[str, Any]) -> bool:
    """Whether the Job has a Complete or Failed condition."""
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions
    )


def job_of_pod(pod: str) -> str:
    """The Job a pod's name comes from (`<job>-<5 random characters>`)."""
    job, _, _ = pod.rpartition("-")
    return job


def holder_pod(identity: str) -> str:
    """The pod an injected sidecar's holder identity names (`<pod>_<uid[:8]>`)."""
    return contract.identity_pod(identity)


def _holds(version: LeaseVersion, pod: str) -> bool:
    """This version names `pod` as holder, or as the holder just cleared (renewTime kept)."""
    if version.holder:
        return holder_pod(version.holder) == pod
    return bool(version.last_holder) and holder_pod(version.last_holder) == pod


def lease_expiry(versions: Sequence[LeaseVersion], pod: str) -> float | None:
    """When the Lease `pod` held expired, on this host's monotonic clock; None if never held.

    The latest renewTime + leaseDurationSeconds of a version held by the pod. A release or
    an expiry clears the holder but keeps renewTime, so the version that cleared it counts.
    """
    expiries = [
        v.renew_time + v.duration - v.offset
        for v in versions
        if _holds(v, pod) and v.renew_time is not None and v.duration is not None
    ]
    return max(expiries) if expiries else None


def lease_end(versions: Sequence[LeaseVersion], pod: str) -> str:
    """How `pod`'s hold on its Lease ended.

    `released` (its sidecar gave it back before it expired), `lost` (it expired: cleared by
    the operator, taken over, or given back too late), `held` (still its at the last version
    seen) or `never` (it never held it).
    """
    held = [index for index, v in enumerate(versions) if v.holder and holder_pod(v.holder) == pod]
    if not held:
        return "never"
    later = versions[held[-1] + 1 :]
    if not later:
        return "held"
    after = later[0]
    expiry = lease_expiry(versions, pod)
    released = (
        not after.holder
        and holder_pod(after.last_holder) == pod
        and after.released_at is not None
        and expiry is not None
        and after.released_at - after.offset < expiry
    )
    return "released" if released else "lost"


def after_expiry(work: Work, versions: Sequence[LeaseVersion]) -> float | None:
    """How long after its pod's Lease expired the work still ran (negative: stopped before).

    None while it runs, or when its pod never held the Lease.
    """
    expiry = lease_expiry(versions, work.pod)
    if work.stopped is None or expiry is None:
        return None
    return work.stopped - expiry


def recovery_after(cleared: float, works: Sequence[Work]) -> float | None:
    """Seconds from when the lock was free of a fault's effects to the next work's start.

    The lock is free of it once the fault is cleared and every work that started before
    has stopped; None while no work has started since (or one from before still runs).
    """
    if not cleared:
        return None
    earlier = [work for work in works if work.started <= cleared]
    if any(work.stopped is None for work in earlier):
        return None
    free_from = max([cleared, *(work.stopped for work in earlier if work.stopped is not None)])
    later = [work.started for work in works if work.started > cleared]
    if not later:
        return None
    return max(0.0, min(later) - free_from)


class WorkRecords:
    """What a trial's work units wrote to their shared events file: clock-free counts."""

    def __init__(self, path: Path) -> None:
        self.events = EventsFile(path)
        self.counts: collections.Counter[str] = collections.Counter()

    def read(self) -> None:
        for event in self.events.new_events():
            self.counts[event["event"]] += 1

    def tally(self, counts: Counts) -> None:
        self.read()
        counts.runs = self.counts["start"]
        counts.completed = self.counts["end"]
        counts.stopped = self.counts["start"] - self.counts["end"]
        counts.overlaps = self.counts["overlap"]
        counts.refused = self.counts["refused"]


# --- the checker -------------------------------------------------------------------------------


class PodChecker:
    """Runs pod-mode trials in `namespace`, with a running operator, node and work tracker."""

    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        node: RealNode | Sequence[RealNode],
        tracker: WorkTracker,
        recorder: PodRecorder,
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
        # Node 1 first: it carries the fleet's shared pod relay (cut-pods).
        self.nodes = [node] if isinstance(node, RealNode) else list(node)
        self.node = self.nodes[0]
        self.tracker = tracker
        self.recorder = recorder
        self.leases = LeaseRecorder(api, namespace)
        self.operator = operator
        self.namespace = namespace
        self.settings = settings
        self.faults = list(faults)
        self.seed = seed
        self.random = random.Random(seed)  # noqa: S311 - reproducible fault schedules
        self.components = components
        self.mark = secrets.token_hex(4)
        # Each trial's directory is a hostPath volume of its pods (UID 65532).
        base = workdir or Path(tempfile.mkdtemp(prefix="cronlock-pods-"))
        self.workdir = base / f"{time.strftime('%Y%m%dT%H%M%S')}-{self.mark}"
        self.log = log
        self.trials: list[PodTrial] = []
        self._cronjob = ""

    # --- the whole run ------------------------------------------------------------------------
    def run(
        self,
        trials: int,
        faults_per_trial: int = 2,
        min_runs: int = 0,
        on_trial: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """`trials` trials, every fault kind as evenly as they allow; then, for a soak, more
        trials (a new plan of the same size each time) until `min_runs` works ran.

        `on_trial` gets the report so far after each trial: a soak cut short keeps it."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workdir.chmod(0o755)
        if "preempt" in self.faults:
            self._ensure_priority_class()
        self.leases.start()
        started = time.monotonic()
        bound = self.settings.recovery_bound

        def plans() -> Iterator[list[str]]:
            yield from plan_faults(self.faults, trials, faults_per_trial, self.random)
            while sum(trial.runs for trial in self.trials) < min_runs:
                yield from plan_faults(self.faults, trials, faults_per_trial, self.random)

        try:
            for index, kinds in enumerate(plans()):
                try:
                    trial = self._trial(index, kinds)
                finally:
                    if self.components is not None:
                        self.components.resume_all()
                    if self.operator.process is None:
                        self.operator.start()
                self.trials.append(trial)
                self.log(self._trial_line(trial, kinds, bound))
                if on_trial is not None:
                    on_trial(self.report(time.monotonic() - started))
        finally:
            self.leases.stop()
        return self.report(time.monotonic() - started)

    @staticmethod
    def _trial_line(trial: PodTrial, kinds: list[str], bound: float) -> str:
        faults = [
            f"{fault.kind}: {fault.error or fault.detail}; holder {fault.holder or '-'} "
            f"{fault.lease_end or '-'}, work stop - lease expiry "
            + ("-" if fault.after_expiry is None else f"{fault.after_expiry:+.1f}s")
            + f", recovery {fault.summary(bound)['recovery_s']}"
            for fault in trial.faults
        ]
        worst = max(trial.after_expiry, default=None)
        return (
            f"trial {trial.index}: faults {','.join(kinds) or '-'} {faults} runs {trial.runs} "
            f"jobs {trial.jobs} overlaps {trial.overlaps}/{trial.tracker_overlaps} "
            f"refused {trial.refused} max stop - expiry "
            + ("-" if worst is None else f"{worst:+.1f}s")
            + f" {'TIMED OUT ' if trial.timed_out else ''}{trial.seconds:.1f}s"
        )

    def report(self, seconds: float) -> dict[str, Any]:
        """checker.py's report, plus the works' stops against their Leases' expiries."""
        bound = self.settings.recovery_bound
        faults = [fault for trial in self.trials for fault in trial.faults]
        by_kind: dict[str, dict[str, Any]] = {}
        for kind, row in fault_rows(self.trials, bound).items():
            mine = [fault for fault in faults if fault.kind == kind]
            trials = {fault.trial for fault in mine}
            afters = [fault.after_expiry for fault in mine if fault.after_expiry is not None]
            by_kind[kind] = {
                "trials": len(trials),
                **row,
                "tracker_overlaps": sum(
                    t.tracker_overlaps for t in self.trials if t.index in trials
                ),
                "recovery_s": [fault.summary(bound)["recovery_s"] for fault in mine],
                "lost_leases": sum(fault.lease_end == "lost" for fault in mine),
                "max_after_expiry_s": round(max(afters), 2) if afters else None,
                "corrupted_cronjobs": sum(fault.corrupted for fault in mine),
                "killed_before_the_patch": sum(fault.before_patch for fault in mine),
                "details": [
                    f"{fault.detail}; {fault.holder} {fault.lease_end}"
                    + (
                        ""
                        if fault.after_expiry is None
                        else f", stopped {fault.after_expiry:+.1f}s after its Lease's expiry"
                    )
                    for fault in mine
                ],
            }
        outcomes: collections.Counter[str] = collections.Counter()
        for trial in self.trials:
            outcomes.update(trial.outcomes)
        afters = [value for trial in self.trials for value in trial.after_expiry]
        return {
            "seed": self.seed,
            "settings": {
                **asdict(self.settings),
                "renew_deadline_s": round(self.settings.renew_deadline, 2),
                "kill_grace_s": self.settings.kill_grace,
                "recovery_bound_s": bound,
            },
            "trials": len(self.trials),
            "faults": len(faults),
            "runs": sum(t.runs for t in self.trials),
            "jobs": sum(t.jobs for t in self.trials),
            "completed_runs": sum(t.completed for t in self.trials),
            "stopped_runs": sum(t.stopped for t in self.trials),
            "overlaps": sum(t.overlaps for t in self.trials),
            "tracker_overlaps": sum(t.tracker_overlaps for t in self.trials),
            "refused_stale_writes": sum(t.refused for t in self.trials),
            "max_after_expiry_s": round(max(afters), 2) if afters else None,
            "works_past_expiry": sum(value >= 0 for value in afters),
            "works_compared_with_expiry": len(afters),
            "works_without_lease": [pod for t in self.trials for pod in t.works_without_lease],
            "lost_leases": sum(f.lease_end == "lost" for f in faults),
            "delayed": sum(f.summary(bound)["delayed"] for f in faults),
            "timed_out_trials": sum(t.timed_out for t in self.trials),
            "leftover_works": sum(t.leftover_works for t in self.trials),
            "fault_errors": sum(bool(f.error) for f in faults),
            "corrupted_cronjobs": sum(f.corrupted for f in faults)
            + sum(len(t.bad_templates) for t in self.trials),
            "pod_outcomes": dict(sorted(outcomes.items())),
            "nodes": [node.name for node in self.nodes],
            "runs_by_node": self._runs_by_node(),
            "by_fault": by_kind,
            "seconds": round(seconds, 1),
        }

    def _runs_by_node(self) -> dict[str, int]:
        """How many pods that ran a work each node ran (the recorder's view)."""
        ran = {work.pod for work in self.tracker.works(f"pods-{self.mark}-")}
        counted: collections.Counter[str] = collections.Counter()
        for pod in self.recorder.pods():
            if pod["metadata"]["name"] in ran:
                counted[(pod.get("spec") or {}).get("nodeName") or "?"] += 1
        return dict(sorted(counted.items()))

    # --- one trial ----------------------------------------------------------------------------
    def _trial(self, index: int, kinds: list[str]) -> PodTrial:
        directory = self.workdir / f"trial-{index:03d}"
        directory.mkdir()
        directory.chmod(0o777)
        for name in SHARED_FILES:
            (directory / name).touch()
            (directory / name).chmod(0o666)
        trial = PodTrial(index, [PodFault(kind, index) for kind in kinds])
        records = WorkRecords(directory / "events.jsonl")
        self._cronjob = f"pods-{self.mark}-{index}"
        self._create_cronjob(self._cronjob, directory)
        contenders: list[Contender] = []
        threads: list[tuple[PodFault, threading.Thread]] = []
        pending = list(trial.faults)
        targeted: set[str] = set()
        next_fault: tuple[str, float] | None = None  # (pod, when)
        spawn_after = refresh_after = 0.0
        started = time.monotonic()
        deadline = started + self.settings.trial_timeout
        try:
            while True:
                now = time.monotonic()
                works = self._works()
                busy = [fault for fault, thread in threads if thread.is_alive()]
                api_away = any(fault.kind in API_AWAY for fault in busy)
                if now >= refresh_after and not api_away:
                    self._update(contenders, now)
                    refresh_after = now + 0.5
                alive = [c for c in contenders if not c.done]
                enough = self._enough(works, trial, pending, busy)
                if (
                    len(alive) < self.settings.contenders
                    and not enough
                    and not api_away
                    and now >= spawn_after
                ):
                    # Long works while the next fault needs one to hit.
                    long = bool(pending) and pending[0].kind in LONG_WORK_FAULTS
                    contender = self._spawn(trial, long)
                    if contender is not None:
                        contenders.append(contender)
                    spawn_after = now + 1.0
                # Each fault hits a work no earlier fault has hit, 0.2-1s after it started.
                longs = {c.job for c in contenders if c.long}
                fresh = [
                    work
                    for work in works
                    if work.running
                    and work.pod not in targeted
                    and (
                        not pending
                        or pending[0].kind not in LONG_WORK_FAULTS
                        or job_of_pod(work.pod) in longs
                    )
                ]
                if pending and fresh and not busy:
                    holder = max(fresh, key=lambda work: work.started)
                    if next_fault is None or next_fault[0] != holder.pod:
                        next_fault = (holder.pod, holder.started + self.random.uniform(0.2, 1.0))
                    elif now >= next_fault[1]:
                        fault = pending.pop(0)
                        thread = threading.Thread(
                            target=self._inject, args=(fault, holder), daemon=True
                        )
                        thread.start()
                        threads.append((fault, thread))
                        targeted.add(holder.pod)
                        next_fault = None
                if enough and not any(work.running for work in works):
                    break
                if now >= deadline:
                    trial.timed_out = True
                    break
                time.sleep(TICK)
        finally:
            for _, thread in threads:
                thread.join(timeout=120)
            if self.components is not None:
                self.components.resume_all()
            if self.operator.process is None:
                self.operator.start()
            trial.leftover_works = self._stop(contenders)
        self._tally(trial, records, contenders)
        trial.seconds = time.monotonic() - started
        return trial

    def _works(self) -> list[Work]:
        """The works of the current trial's pods, as the tracker saw them."""
        return self.tracker.works(f"{self._cronjob}-")

    def _enough(
        self, works: list[Work], trial: PodTrial, pending: list[PodFault], busy: list[PodFault]
    ) -> bool:
        """Enough work starts, every fault injected and cleared, and a start after each."""
        if pending or busy or len(works) < self.settings.runs_per_trial:
            return False
        return all(recovery_after(fault.cleared, works) is not None for fault in trial.faults)

    def _tally(self, trial: PodTrial, records: WorkRecords, contenders: list[Contender]) -> None:
        records.tally(trial)
        works = self._works()
        versions = self.leases.versions(contract.lease_name(self._cronjob))
        trial.tracker_overlaps = len(overlapping(works))
        trial.after_expiry = [
            value for work in works if (value := after_expiry(work, versions)) is not None
        ]
        trial.works_without_lease = [
            work.pod
            for work in works
            if work.stopped is not None and lease_expiry(versions, work.pod) is None
        ]
        by_pod = {work.pod: work for work in works}
        for fault in trial.faults:
            fault.recovery = recovery_after(fault.cleared, works)
            work = by_pod.get(fault.holder)
            if work is not None:
                fault.lease_end = lease_end(versions, work.pod)
                fault.after_expiry = after_expiry(work, versions)
        trial.jobs = len(contenders)
        for contender in contenders:
            pods = self.recorder.pods(contender.job)
            name = contender.outcome or outcome(pods[-1] if pods else None)
            trial.outcomes[name] = trial.outcomes.get(name, 0) + 1

    def _create_cronjob(self, name: str, directory: Path) -> None:
        settings = self.settings
        body = make_cronjob(
            name=name,
            namespace=None,
            schedule=NEVER,
            annotations={
                contract.ANNOTATION_ENABLED: "true",
                contract.ANNOTATION_TTL: f"{settings.ttl}s",
                contract.ANNOTATION_RENEW: f"{settings.renew}s",
                contract.ANNOTATION_POLICY: "wait",
                contract.ANNOTATION_WAIT_TIMEOUT: f"{settings.wait_timeout}s",
            },
            restart_policy="Never",
            job={"backoffLimit": 0},
            securityContext={
                "runAsNonRoot": True,
                "runAsUser": POD_USER,
                "runAsGroup": POD_USER,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            containers=[
                {
                    "name": MAIN,
                    "image": CRONLOCK_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": work_command(self.tracker.port, settings.work[0]),
                    "volumeMounts": [{"name": SHARED_VOLUME, "mountPath": SHARED}],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "readOnlyRootFilesystem": True,
                    },
                }
            ],
            volumes=[
                {
                    "name": SHARED_VOLUME,
                    "hostPath": {"path": str(directory), "type": "DirectoryOrCreate"},
                }
            ],
        )
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

    def _spawn(self, trial: PodTrial, long: bool) -> Contender | None:
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
            seconds = self.settings.long_work_seconds if long else self.settings.work
            main["command"][-1] = f"{self.random.uniform(*seconds):.2f}"
            self.batch.create_namespaced_job(
                self.namespace, body, _request_timeout=10, _preload_content=False
            )
        except API_ERRORS as error:
            self.log(f"cannot create Job {name} now: {type(error).__name__}")
            return None
        trial.jobs += 1
        return Contender(name, time.monotonic(), long)

    def _update(self, contenders: list[Contender], now: float) -> None:
        """A contender is done once its Job finished or is gone (a skipped Job is deleted)."""
        try:
            raw = self.batch.list_namespaced_job(
                self.namespace,
                label_selector=f"{contract.LABEL_LOCK}={self._cronjob}",
                _request_timeout=10,
                _preload_content=False,
            )
        except API_ERRORS:
            return
        jobs = {job["metadata"]["name"]: job for job in json.loads(raw.data)["items"]}
        for contender in contenders:
            if contender.done:
                continue
            job = jobs.get(contender.job)
            if job is None:
                contender.done = now - contender.created > 5
            else:
                contender.done = job_finished(job)

    def _stop(self, contenders: list[Contender]) -> int:
        """Delete the trial's CronJob and pods, wait until their works stopped; how many did not."""
        for contender in contenders:
            if not contender.done:
                # Still deciding, waiting for the lock or working when the trial had enough.
                contender.done, contender.outcome = True, "stopped-at-trial-end"
        selector = f"{contract.LABEL_LOCK}={self._cronjob}"
        with contextlib.suppress(*API_ERRORS):
            self.batch.delete_namespaced_cron_job(
                self._cronjob, self.namespace, propagation_policy="Background", _request_timeout=10
            )
        with contextlib.suppress(*API_ERRORS):
            self.core.delete_collection_namespaced_pod(
                self.namespace,
                label_selector=selector,
                grace_period_seconds=self.settings.kill_grace,
                _request_timeout=10,
            )
        deadline = time.monotonic() + self.settings.stop_timeout
        while time.monotonic() < deadline:
            running = [work for work in self._works() if work.running]
            with contextlib.suppress(*API_ERRORS):
                if (
                    not running
                    and not self.core.list_namespaced_pod(
                        self.namespace, label_selector=selector, _request_timeout=10
                    ).items
                ):
                    return 0
            time.sleep(0.5)
        leftover = [work.pod for work in self._works() if work.running]
        self.log(f"{self._cronjob}: works still running after the trial: {leftover}")
        return len(leftover)

    # --- faults -------------------------------------------------------------------------------
    def _inject(self, fault: PodFault, holder: Work) -> None:
        settings = self.settings
        fault.fired = time.monotonic()
        fault.holder = holder.pod
        try:
            if fault.kind in NODE_FAULTS:
                self._inject_on_node(fault, holder)
                return
            if fault.kind == "cut-pods":
                # Until the holder's renew deadline has passed at least.
                seconds = self.random.uniform(
                    settings.renew_deadline + 1, settings.ttl + settings.skew + 2
                )
                self.node.cut_pods_off()
                try:
                    time.sleep(seconds)
                finally:
                    self.node.reconnect_pods()
                fault.detail = f"{seconds:.1f}s, {self._work_fate(holder, fault.fired)}"
            elif fault.kind == "stop-sidecar":
                seconds = self.random.uniform(1, settings.ttl + settings.skew + 2)
                pid = self._node_of(holder.pod).signal_container(
                    self._pod_uid(holder.pod), contract.SIDECAR_CONTAINER, signal.SIGSTOP
                )
                try:
                    time.sleep(seconds)
                finally:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
                fault.detail = f"{seconds:.1f}s, {self._work_fate(holder, fault.fired)}"
            elif fault.kind == "kill-sidecar":
                self._node_of(holder.pod).signal_container(
                    self._pod_uid(holder.pod), contract.SIDECAR_CONTAINER, signal.SIGKILL
                )
                fault.detail = holder.pod
            elif fault.kind == "kill-main":
                self._node_of(holder.pod).signal_container(
                    self._pod_uid(holder.pod), MAIN, signal.SIGKILL
                )
                fault.detail = holder.pod
            elif fault.kind == "delete-pod":
                self.core.delete_namespaced_pod(holder.pod, self.namespace, _request_timeout=10)
                fault.detail = holder.pod
            elif fault.kind == "node-loss":
                seconds = self.random.uniform(settings.ttl + 1, settings.ttl + settings.skew + 4)
                node = self._node_of(holder.pod)
                node.stop_kubelet()
                try:
                    time.sleep(seconds)
                finally:
                    node.start_kubelet()
                fault.detail = (
                    f"kubelet away {seconds:.1f}s, back after {time.monotonic() - fault.fired:.1f}s"
                    f", {self._work_fate(holder, fault.fired)}"
                )
            elif fault.kind == "pause-apiserver" and self.components is not None:
                seconds = self.random.uniform(2, settings.ttl + 4)
                self.components.pause("kube-apiserver")
                try:
                    time.sleep(seconds)
                finally:
                    self.components.resume("kube-apiserver")
                self.components.wait_ready()
                fault.detail = f"{seconds:.1f}s, {self._work_fate(holder, fault.fired)}"
            elif fault.kind == "kill-operator":
                self._kill_operator(fault)
            else:
                raise ValueError(f"cannot inject {fault.kind} here")
        except Exception as error:  # noqa: BLE001 - reported per fault, the trial goes on
            fault.error = f"{type(error).__name__}: {error}"
        finally:
            if not fault.cleared:
                fault.cleared = time.monotonic()

    def _inject_on_node(self, fault: PodFault, holder: Work) -> None:
        """The node faults (NODE_FAULTS) on the node that runs the holder's pod."""
        settings = self.settings
        node = self._node_of(holder.pod)
        where = f"{holder.pod} on {node.name}"
        if fault.kind == "partition":
            seconds = self.random.uniform(
                settings.renew_deadline + 1, settings.ttl + settings.skew + 2
            )
            with node.partitioned():
                time.sleep(seconds)
            fault.detail = f"{node.name} {seconds:.1f}s, {self._work_fate(holder, fault.fired)}"
        elif fault.kind == "restart-containerd":
            seconds = self.random.uniform(1, settings.ttl)
            node.stop_containerd()
            try:
                time.sleep(seconds)
            finally:
                node.start_containerd()
            fault.detail = f"{node.name} {seconds:.1f}s, {self._work_fate(holder, fault.fired)}"
        elif fault.kind == "evict":
            self._evict(holder.pod)
            fault.detail = where
        elif fault.kind == "preempt":
            fault.detail = f"{where}: {self._preempt(holder, node.name, fault.fired)}"
        elif fault.kind == "drain":
            # kubectl drain: cordon, evict what runs there, and (here) uncordon after a while.
            self._cordon(node.name, True)
            try:
                drained = [pod for pod in self._running_pods() if self._node_name(pod) == node.name]
                for pod in drained:
                    self._evict(pod)
                time.sleep(self.random.uniform(2, 6))
            finally:
                self._cordon(node.name, False)
            fault.detail = f"{node.name}: evicted {len(drained)} pod(s)"
        elif fault.kind == "delete-node":
            # The pod GC controller deletes the pods of a Node that is gone, and the node's
            # kubelet then stops them; a kubelet restart registers the Node again.
            self.core.delete_node(node.name, _request_timeout=10)
            try:
                deadline = time.monotonic() + 120
                while holder.running and time.monotonic() < deadline:
                    time.sleep(0.5)
            finally:
                node.stop_kubelet()
                node.start_kubelet()
            fault.detail = f"{node.name}, {self._work_fate(holder, fault.fired)}"
        else:
            raise ValueError(f"cannot inject {fault.kind} here")

    def _evict(self, pod: str) -> None:
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": self.namespace},
        }
        with contextlib.suppress(kubernetes.client.ApiException):  # gone already: fine
            self.core.create_namespaced_pod_eviction(pod, self.namespace, body, _request_timeout=10)

    def _preempt(self, holder: Work, node: str, fired: float) -> str:
        """A pod of a higher priority that fits on the holder's node only without the holder.

        Its required anti-affinity to the holder's Job leaves the scheduler one way: preempt
        the holder (the DefaultPreemption plugin; the victim gets DisruptionTarget and is
        deleted with its grace). The preemptor goes once the holder's work stopped.
        """
        name = f"preemptor-{self._cronjob}-{secrets.token_hex(2)}"
        affinity = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                }
            },
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {
                            "matchLabels": {"batch.kubernetes.io/job-name": job_of_pod(holder.pod)}
                        },
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            },
        }
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "priorityClassName": PREEMPTOR_PRIORITY_CLASS,
                "affinity": affinity,
                "terminationGracePeriodSeconds": 0,
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": POD_USER,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [
                    {
                        "name": "preemptor",
                        "image": CRONLOCK_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["sleep", "600"],
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                            "readOnlyRootFilesystem": True,
                        },
                    }
                ],
            },
        }
        self.core.create_namespaced_pod(self.namespace, body, _request_timeout=10)
        try:
            deadline = time.monotonic() + 120
            while holder.running and time.monotonic() < deadline:
                time.sleep(0.5)
            pod = self.core.read_namespaced_pod(name, self.namespace, _request_timeout=10)
            placed = pod.spec.node_name or pod.status.nominated_node_name or "not placed"
        finally:
            with contextlib.suppress(kubernetes.client.ApiException):
                self.core.delete_namespaced_pod(
                    name, self.namespace, grace_period_seconds=0, _request_timeout=10
                )
        reason = self._disruption(holder.pod)
        if reason != "PreemptionByScheduler":
            raise RuntimeError(f"{holder.pod} not preempted (DisruptionTarget: {reason})")
        return f"preemptor on {placed}, {self._work_fate(holder, fired)}"

    def _disruption(self, pod: str) -> str | None:
        """The reason of the pod's DisruptionTarget condition, as last recorded."""
        found = [p for p in self.recorder.pods() if p["metadata"]["name"] == pod]
        conditions = ((found[-1].get("status") or {}).get("conditions") or []) if found else []
        reasons = [c.get("reason") for c in conditions if c.get("type") == "DisruptionTarget"]
        return str(reasons[-1]) if reasons else None

    def _ensure_priority_class(self) -> None:
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": PREEMPTOR_PRIORITY_CLASS},
            "value": 1000000,
            "description": "tests/reliability/pods.py: the preempt fault's pods",
        }
        try:
            kubernetes.client.SchedulingV1Api(self.api).create_priority_class(
                body, _request_timeout=10
            )
        except kubernetes.client.ApiException as error:
            if error.status != 409:
                raise

    def _cordon(self, node: str, on: bool) -> None:
        self.core.patch_node(node, {"spec": {"unschedulable": on}}, _request_timeout=10)

    def _running_pods(self) -> list[str]:
        return [
            pod["metadata"]["name"]
            for pod in self.recorder.pods()
            if pod["metadata"]["name"].startswith(f"{self._cronjob}-")
            and (pod.get("status") or {}).get("phase") in ("Pending", "Running")
        ]

    def _node_name(self, pod: str) -> str:
        found = [p for p in self.recorder.pods() if p["metadata"]["name"] == pod]
        name = ((found[-1].get("spec") or {}).get("nodeName") if found else None) or ""
        if not name:
            read = self.core.read_namespaced_pod(pod, self.namespace, _request_timeout=10)
            name = read.spec.node_name or ""
        return str(name)

    def _node_of(self, pod: str) -> RealNode:
        """The node the pod runs on (node 1 when there is one node)."""
        if len(self.nodes) == 1:
            return self.node
        name = self._node_name(pod)
        for node in self.nodes:
            if node.name == name:
                return node
        raise LookupError(f"pod {pod} runs on {name!r}, not a node of this checker")

    @staticmethod
    def _work_fate(work: Work, fired: float) -> str:
        if work.stopped is None:
            return "work went on"
        return f"work stopped {work.stopped - fired:.1f}s after the fault"

    def _pod_uid(self, pod: str) -> str:
        found = [p for p in self.recorder.pods() if p["metadata"]["name"] == pod]
        if found:
            return str(found[-1]["metadata"]["uid"])
        read = self.core.read_namespaced_pod(pod, self.namespace, _request_timeout=10)
        return str(read.metadata.uid)

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
@dataclass
class PodEnvironment:
    """What the checker needs around it: an admin client, the node, the tracker, the operator."""

    api: kubernetes.client.ApiClient
    nodes: list[RealNode]
    tracker: WorkTracker
    operator: OperatorProcess


@contextmanager
def node_and_operator(cluster: Cluster, env_dir: Path, nodes: int = 1) -> Iterator[PodEnvironment]:
    """The chart's RBAC, the real node, the work tracker, and the operator as its ServiceAccount.

    The e2e fixtures' code paths (tests/e2e/conftest.py): `RealNode` for
    tests/controlplane/node, `WorkTracker`, and the operator with the image built from our
    Dockerfile.
    """
    env_dir = cluster.env_dir or env_dir
    api = kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))
    plane = ControlPlane(cluster.kubeconfig, cluster.env, env_dir)
    try:
        account = install_chart_rbac(api, cluster.env)
    except kubernetes.utils.FailToCreateError as error:
        if any(e.status != 409 for e in error.api_exceptions):
            raise
        account = next(
            d["metadata"]["name"]
            for d in render_chart(cluster.env)
            if d["kind"] == "ServiceAccount"
        )
    operator_kubeconfig = make_service_account_kubeconfig(
        plane, api, "cronlock-system", account, env_dir
    )
    fleet = [
        RealNode(dict(cluster.env, CRONLOCK_TESTENV_DIR=str(env_dir)), index=index)
        for index in range(1, nodes + 1)
    ]
    for node in fleet:
        node.start()
    tracker = WorkTracker()
    operator = OperatorProcess(
        operator_kubeconfig, env_dir / "pods-operator.log", cluster.env, list(OPERATOR_ARGS)
    )
    try:
        tracker.start()
        operator.start()
        yield PodEnvironment(api, fleet, tracker, operator)
    finally:
        operator.stop()
        tracker.close()
        for node in reversed(fleet):
            node.stop()
        api.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.reliability.pods", description=__doc__.splitlines()[0]
    )
    defaults = PodSettings()
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument(
        "--nodes",
        type=int,
        choices=(1, 2),
        default=1,
        help="real nodes to spread the pods over (default 1; 2 for the fleet faults)",
    )
    parser.add_argument(
        "--soak",
        type=int,
        default=0,
        metavar="RUNS",
        help="after --trials, go on with more trials until this many works ran",
    )
    parser.add_argument("--faults-per-trial", type=int, default=2)
    parser.add_argument(
        "--faults",
        default=",".join(POD_FAULTS),
        help=f"comma-separated, from {', '.join(POD_FAULTS)}, or 'none' (default: all)",
    )
    parser.add_argument("--contenders", type=int, default=defaults.contenders)
    parser.add_argument("--runs-per-trial", type=int, default=defaults.runs_per_trial)
    parser.add_argument(
        "--ttl",
        type=int,
        default=defaults.ttl,
        help=f"seconds (default {defaults.ttl}, the operator's minimum)",
    )
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
    argv_used = list(sys.argv[1:] if argv is None else argv)
    if os.geteuid() != 0:
        parser.error("needs root: the node's kubelet, containerd and network namespace")
    faults = fault_list(args.faults)
    # The trials' directories are hostPath volumes: absolute paths.
    env_dir = args.env_dir.resolve()
    seed = seed_of(args.seed)
    try:
        settings = PodSettings(
            ttl=args.ttl,
            renew=args.renew,
            slack=args.slack,
            operator_kill_window=args.operator_kill_window,
            contenders=args.contenders,
            runs_per_trial=args.runs_per_trial,
        )
    except ValueError as error:
        parser.error(str(error))

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    # SIGTERM unwinds like Ctrl-C: pods, node, operator and control plane are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    namespace = f"cronlock-pods-{secrets.token_hex(3)}"
    with (
        own_controlplane(env_dir, args.keep_controlplane) as cluster,
        node_and_operator(cluster, env_dir, args.nodes) as around,
    ):
        kubernetes.client.CoreV1Api(around.api).create_namespace({"metadata": {"name": namespace}})
        recorder = PodRecorder(around.api, namespace)
        recorder.start()
        try:
            checker = PodChecker(
                around.api,
                around.nodes,
                around.tracker,
                recorder,
                around.operator,
                namespace,
                settings,
                faults,
                seed,
                components_of(cluster),
                workdir=env_dir / "pods-work",
                log=log,
            )
            log(f"seed {seed}; ttl {settings.ttl}s; work units' files under {checker.workdir}")
            about = {
                "command": shlex.join(["python", "-m", "tests.reliability.pods", *argv_used]),
                "commit": commit_of(ROOT),
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }

            def so_far(partial: dict[str, Any]) -> None:
                if args.output is not None:
                    write_report(args.output, {**about, **partial, "finished": False})

            report = checker.run(
                args.trials, args.faults_per_trial, min_runs=args.soak, on_trial=so_far
            )
            report = {**about, **report, "finished": True}
        finally:
            recorder.stop()
    publish(report, args.output)
    return 0 if guarantee_held(report) else 1


def commit_of(root: Path) -> str:
    """The checked-out commit (with `+dirty` for uncommitted changes), for the report."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def write_report(path: Path, report: Mapping[str, Any]) -> None:
    """The report as JSON in `path`, replaced whole (a reader never sees half of it)."""
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(report, indent=2) + "\n")
    partial.replace(path)


def guarantee_held(report: Mapping[str, Any]) -> bool:
    """No overlap, no work past its Lease's expiry or without one, nothing stuck or corrupted."""
    must_be_zero = (
        "overlaps",
        "tracker_overlaps",
        "works_past_expiry",
        "delayed",
        "timed_out_trials",
        "leftover_works",
        "corrupted_cronjobs",
        "fault_errors",
    )
    return all(report[key] == 0 for key in must_be_zero) and not report["works_without_lease"]


if __name__ == "__main__":
    sys.exit(main())
