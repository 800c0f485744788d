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

`--permits N --cronjobs M` (issue 58): M CronJobs share the trial's lock of N permits, on
`* * * * *` so that scheduled ticks contend with the manual runs; each work fences with
its permit's token in its permit's store, the tracker's check is `crowded(works, N)`, each
work's stop is compared with its own permit's expiry, and a permit's token going back on
the Lease is a failure (docs/RELIABILITY.md, "Permits: at most N working").

This module holds the checker and its command line. The settings, the work unit and the
records are in pod_work.py, the pure checks in pod_checks.py, the faults in pod_faults.py.
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
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import kubernetes

from cronlock_sidecar import contract
from tests.reliability.checker import (
    TICK,
    add_common_arguments,
    components_of,
    fault_list,
    fault_rows,
    publish,
    seed_of,
)
from tests.reliability.ha_faults import HA_FAULTS, is_ha
from tests.reliability.pod_checks import (
    WorkRecords,
    after_expiry,
    injection_problems,
    job_finished,
    job_of_pod,
    lease_end,
    lease_expiry,
    most_at_once,
    outcome,
    plan_faults,
    recovery_after,
    token_regressions,
    tokens_by_permit,
)
from tests.reliability.pod_faults import PodFaults
from tests.reliability.pod_work import (
    API_AWAY,
    API_ERRORS,
    CRONJOB_SUFFIXES,
    EVERY_MINUTE,
    HA_POD_FAULTS,
    LONG_WORK_FAULTS,
    MAIN,
    NEVER,
    POD_FAULTS,
    POD_USER,
    SHARED,
    SHARED_FILES,
    SHARED_VOLUME,
    Contender,
    PodFault,
    PodSettings,
    PodTrial,
    work_command,
)
from tests.support import gen
from tests.support.controlplane import own_controlplane
from tests.support.cronjobs import job_from_cronjob
from tests.support.environment import node_and_operator
from tests.support.node import (
    CRONLOCK_IMAGE,
    LeaseRecorder,
    PodRecorder,
    RealNode,
    Work,
    WorkTracker,
    crowded,
    overlapping,
)
from tests.support.operator import (
    OperatorProcess,
)
from tests.support.paths import ROOT
from tests.support.processes import ControlPlaneProcesses

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
        ha = is_ha(components)
        unknown = set(faults) - set(HA_POD_FAULTS if ha else POD_FAULTS)
        if unknown:
            where = "on an HA control plane" if ha else "without --ha"
            raise ValueError(f"faults unknown {where}: {', '.join(sorted(unknown))}")
        if components is None and "pause-apiserver" in faults:
            raise ValueError("pause-apiserver needs the local control plane (tests/controlplane)")
        self.api = api
        self.batch = kubernetes.client.BatchV1Api(api)
        self.core = kubernetes.client.CoreV1Api(api)
        # Node 1 first: it carries the fleet's shared pod relay (cut-pods).
        self.nodes = [node] if isinstance(node, RealNode) else list(node)
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
        # The trial's CronJobs (the first's name starts every other's, their Jobs' and
        # pods') and their lock: the first's name, or with several a lock of its own.
        self._cronjob = ""
        self._cronjobs: list[str] = []
        self._lock = ""
        self.injector = PodFaults(
            api,
            self.batch,
            self.core,
            self.nodes,
            recorder,
            operator,
            namespace,
            settings,
            self.random,
            components,
            cronjob=lambda: self._cronjob,
            read_cronjob=self._read_cronjob,
        )

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
            self.injector.ensure_priority_class()
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
            f"refused {trial.refused} by permit {trial.by_permit} tokens {trial.tokens} "
            f"scheduled {trial.scheduled_works} most at once {trial.most_at_once} "
            "max stop - expiry "
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
        by_permit: dict[int, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        for trial in self.trials:
            for permit, counts in trial.by_permit.items():
                by_permit[permit].update(counts)
            for permit, token in trial.tokens.items():
                by_permit[permit]["holders_on_the_lease"] += token
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
            "permits": self.settings.permits,
            "cronjobs": self.settings.cronjobs,
            "scheduled_works": sum(t.scheduled_works for t in self.trials),
            # The most works at one moment: N shows the lock used to its bound.
            "most_at_once": max((t.most_at_once for t in self.trials), default=0),
            # Per permit: works started, writes refused, overlaps (the work units' records),
            # and the permit's fencing tokens handed out (its transitions, summed over trials).
            "by_permit": {str(k): dict(sorted(v.items())) for k, v in sorted(by_permit.items())},
            "token_regressions": [r for t in self.trials for r in t.token_regressions],
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
        if self.settings.permits > 1:
            (directory / "slots").write_text(f"{self.settings.permits}\n")
            (directory / "slots").chmod(0o644)
        trial = PodTrial(index, [PodFault(kind, index) for kind in kinds])
        records = WorkRecords(directory / "events.jsonl")
        self._cronjob = f"pods-{self.mark}-{index}"
        self._cronjobs = [
            self._cronjob,
            *(f"{self._cronjob}-{suffix}" for suffix in CRONJOB_SUFFIXES),
        ][: self.settings.cronjobs]
        self._lock = self._cronjob if self.settings.cronjobs == 1 else f"{self._cronjob}-lock"
        for name in self._cronjobs:
            self._create_cronjob(name, directory)
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
                            target=self.injector.inject, args=(fault, holder), daemon=True
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
        trial.by_permit = records.permit_counts()
        works = self._works()
        versions = self.leases.versions(contract.lease_name(self._lock))
        permits = self.settings.permits
        trial.tracker_overlaps = len(
            overlapping(works) if permits == 1 else crowded(works, permits)
        )
        trial.most_at_once = most_at_once(works)
        trial.tokens = tokens_by_permit(versions)
        trial.token_regressions = token_regressions(versions)
        manual = {contender.job for contender in contenders}
        trial.scheduled_works = sum(job_of_pod(work.pod) not in manual for work in works)
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
        shared: dict[str, str] = {}
        if settings.cronjobs > 1:
            # Each consents to the others: whichever is guarded first, the rest may join.
            shared[contract.ANNOTATION_LOCK] = self._lock
            shared[contract.ANNOTATION_SHARE_LOCK_WITH] = ",".join(self._cronjobs)
        if settings.permits > 1:
            shared[contract.ANNOTATION_PERMITS] = str(settings.permits)
        body = gen.cronjob(
            name,
            gen.in_namespace(None),
            gen.with_schedule(settings.schedule),
            gen.restart_policy("Never"),
            gen.with_annotations(
                {
                    contract.ANNOTATION_ENABLED: "true",
                    contract.ANNOTATION_TTL: f"{settings.ttl}s",
                    contract.ANNOTATION_RENEW: f"{settings.renew}s",
                    contract.ANNOTATION_POLICY: "wait",
                    contract.ANNOTATION_WAIT_TIMEOUT: f"{settings.wait_timeout}s",
                    **shared,
                }
            ),
            gen.containers(
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
            ),
            gen.with_pod(
                securityContext={
                    "runAsNonRoot": True,
                    "runAsUser": POD_USER,
                    "runAsGroup": POD_USER,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                volumes=[
                    {
                        "name": SHARED_VOLUME,
                        "hostPath": {"path": str(directory), "type": "DirectoryOrCreate"},
                    }
                ],
            ),
            gen.with_job(backoffLimit=0),
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
        # One of the trial's CronJobs (no draw with one: a seed's fault plan stays as it was).
        source = self._cronjobs[0]
        if len(self._cronjobs) > 1:
            source = self.random.choice(self._cronjobs)
        name = f"{source}-{trial.jobs + 1}"
        try:
            cronjob = self._read_cronjob(source)
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
                label_selector=f"{contract.LABEL_LOCK}={self._lock}",
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
        selector = f"{contract.LABEL_LOCK}={self._lock}"
        for cronjob in self._cronjobs:
            with contextlib.suppress(*API_ERRORS):
                self.batch.delete_namespaced_cron_job(
                    cronjob, self.namespace, propagation_policy="Background", _request_timeout=10
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


# --- command line ------------------------------------------------------------------------------
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
    parser.add_argument(
        "--permits",
        type=int,
        default=defaults.permits,
        help="cronlock.io/permits of the trial's lock (default 1); the checks allow N at once",
    )
    parser.add_argument(
        "--cronjobs",
        type=int,
        default=defaults.cronjobs,
        help="CronJobs sharing the trial's lock (default 1), each making manual runs",
    )
    parser.add_argument(
        "--schedule",
        default=None,
        help=f"the CronJobs' schedule (default {EVERY_MINUTE!r} with --permits or --cronjobs "
        f"above 1, so scheduled ticks contend too; else {NEVER!r}, never in a trial)",
    )
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
    parser.add_argument(
        "--ha",
        action="store_true",
        help="an HA control plane (3 etcd members, 2 API servers behind a balancer; its own "
        "--env-dir by default); the default faults then have its faults "
        f"({', '.join(HA_FAULTS)}) in pause-apiserver's place",
    )
    add_common_arguments(parser, ROOT / ".testenv" / "reliability-pods")
    args = parser.parse_args(argv)
    if args.ha:
        if args.faults == ",".join(POD_FAULTS):
            args.faults = ",".join(HA_POD_FAULTS)
        if args.env_dir == ROOT / ".testenv" / "reliability-pods":
            args.env_dir = ROOT / ".testenv" / "reliability-pods-ha"
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
            permits=args.permits,
            cronjobs=args.cronjobs,
            schedule=args.schedule
            or (EVERY_MINUTE if args.permits > 1 or args.cronjobs > 1 else NEVER),
        )
    except ValueError as error:
        parser.error(str(error))

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    # SIGTERM unwinds like Ctrl-C: pods, node, operator and control plane are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    namespace = f"cronlock-pods-{secrets.token_hex(3)}"
    with (
        own_controlplane(env_dir, args.keep_controlplane, ha=args.ha) as cluster,
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
    """No overlap (more than N at once with N permits), no fencing token gone back, no work
    past its permit's expiry or without one, nothing stuck or corrupted."""
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
    return (
        all(report[key] == 0 for key in must_be_zero)
        and not report["works_without_lease"]
        # Reports from before the permits mode (docs/soak/) did not look at the tokens.
        and not report.get("token_regressions")
    )


if __name__ == "__main__":
    sys.exit(main())
