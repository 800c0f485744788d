"""A namespace whose pods run on the real node, as the end-to-end tests drive it (`Scenario`)."""

from __future__ import annotations

import contextlib
import copy
import datetime
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import kubernetes

from tests.support import gen
from tests.support.contract import GATE_CONTAINER, SIDECAR_CONTAINER
from tests.support.cronjobs import job_from_cronjob
from tests.support.kube import wait_for
from tests.support.node import (
    BUSYBOX_IMAGE,
    LeaseRecorder,
    PodRecorder,
    RealNode,
    Work,
    WorkTracker,
    container_state,
    exit_code,
    job_of,
    overlapping,
)
from tests.support.operator import OperatorProcess

GATE = GATE_CONTAINER
SIDECAR = SIDECAR_CONTAINER
MAIN = "main"
NEVER = "0 0 1 1 *"


# A work that runs until the test ends it (`Scenario.finish`): a holder that outlasts whatever
# its contenders take to start and decide, however slowly the node starts their pods, with
# no fixed window to outguess (a `sleep 12` once ended before a slow contender decided).
UNTIL_FINISHED = "trap 'echo finished; exit 0' USR1; while :; do sleep 1 & wait $!; done"


def seconds_to_next_minute() -> float:
    return 60 - time.time() % 60


@dataclass
class Scenario:
    """What a user does (CronJobs, manual runs) and sees (Jobs, Events, the Lease, logs)."""

    api: kubernetes.client.ApiClient
    namespace: str
    node: RealNode
    operator: OperatorProcess
    tracker: WorkTracker
    recorder: PodRecorder
    # Every version of the namespace's Leases, kept as evidence should the test fail.
    history: LeaseRecorder | None = None

    @property
    def batch(self) -> kubernetes.client.BatchV1Api:
        return kubernetes.client.BatchV1Api(self.api)

    @property
    def core(self) -> kubernetes.client.CoreV1Api:
        return kubernetes.client.CoreV1Api(self.api)

    # -- what the user does --

    def cronjob(
        self,
        name: str,
        script: str,
        *,
        schedule: str = NEVER,
        backoff_limit: int = 0,
        node: str | None = None,
        platform_uid: bool = False,
        **settings: str,
    ) -> dict[str, Any]:
        """Create an annotated CronJob running `sh -c script` (on `node` if given, by its
        hostname label); return it once injected. `platform_uid`: written for `restricted`
        Pod Security with no UID, for the platform to assign one (OpenShift's SCCs)."""
        placement = {"nodeSelector": {"kubernetes.io/hostname": node}} if node else {}
        pod_security: dict[str, Any] = {"runAsNonRoot": True, "runAsUser": 65532}
        main_security: dict[str, Any] = {}
        if platform_uid:
            pod_security = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
            main_security = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        annotations = {"cronlock.io/enabled": "true", "cronlock.io/ttl": "19s"}
        annotations.update({f"cronlock.io/{k.replace('_', '-')}": v for k, v in settings.items()})
        body = gen.cronjob(
            name,
            gen.in_namespace(None),
            gen.with_schedule(schedule),
            gen.restart_policy("Never"),
            gen.with_annotations(annotations),
            gen.containers(
                {
                    "name": MAIN,
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", self.work(script)],
                    **({"securityContext": main_security} if main_security else {}),
                }
            ),
            gen.with_pod(securityContext=pod_security, **placement),
            gen.with_job(backoffLimit=backoff_limit),
        )
        self.batch.create_namespaced_cron_job(self.namespace, body)
        return wait_for(
            lambda: cronjob if _injected(cronjob := self.read_cronjob(name)) else None,
            timeout=30,
            what=f"the operator to inject CronJob {name}",
        )

    def work(self, script: str) -> str:
        """`script` as a run's work that the tracker sees start and stop."""
        return self.tracker.shell_prefix() + script

    def run(self, cronjob: str, job: str, script: str | None = None) -> None:
        """`kubectl create job JOB --from=cronjob/CRONJOB`, optionally with another script."""
        body = job_from_cronjob(self.read_cronjob(cronjob), job)
        if script is not None:
            body = copy.deepcopy(body)
            container = body["spec"]["template"]["spec"]["containers"][0]
            container["command"] = ["sh", "-c", self.work(script)]
        self.batch.create_namespaced_job(self.namespace, body)

    # -- what the user sees --

    def read_cronjob(self, name: str) -> dict[str, Any]:
        raw = self.batch.read_namespaced_cron_job(name, self.namespace)
        result: dict[str, Any] = self.api.sanitize_for_serialization(raw)
        return result

    def job(self, name: str) -> dict[str, Any] | None:
        try:
            raw = self.batch.read_namespaced_job(name, self.namespace)
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return None
            raise
        result: dict[str, Any] = self.api.sanitize_for_serialization(raw)
        return result

    def job_condition(self, name: str) -> str | None:
        """Complete or Failed once the Job has finished, else None."""
        job = self.job(name) or {}
        for condition in (job.get("status") or {}).get("conditions") or []:
            if condition["type"] in ("Complete", "Failed") and condition["status"] == "True":
                return str(condition["type"])
        return None

    def events(self, involved: str, reason: str) -> list[tuple[str, str]]:
        """(type, message) of the Events with `reason` about object `involved`."""
        items = self.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={involved}"
        ).items
        return [(e.type, e.message) for e in items if e.reason == reason]

    def wait_event(
        self, involved: str, reason: str, count: int = 1, timeout: float = 30
    ) -> list[tuple[str, str]]:
        return wait_for(
            lambda: found if len(found := self.events(involved, reason)) >= count else None,
            timeout=timeout,
            what=f"{count} {reason} Event(s) on {involved}",
        )

    def lease(self, lock: str) -> dict[str, Any]:
        raw = kubernetes.client.CoordinationV1Api(self.api).read_namespaced_lease(
            f"cronlock-{lock}", self.namespace
        )
        result: dict[str, Any] = self.api.sanitize_for_serialization(raw)
        return result

    def consecutive_skips(self, cronjob: str) -> int:
        annotations = self.read_cronjob(cronjob)["metadata"].get("annotations") or {}
        return int(annotations.get("cronlock.io/consecutive-skips", "0"))

    # -- what ran on the node --

    def pods(self, job: str) -> list[dict[str, Any]]:
        """Every pod of the Job the recorder saw, oldest first (deleted ones included)."""
        return self.recorder.pods(job)

    def wait_renewal(self, lock: str, timeout: float = 60) -> float:
        """Wait for the Lease's next renewal; return its expiry on this host's monotonic clock."""
        before = self.lease(lock)["spec"].get("renewTime")

        def renewed() -> dict[str, Any] | None:
            spec: dict[str, Any] = self.lease(lock)["spec"]
            return spec if spec.get("renewTime") not in (None, before) else None

        spec = wait_for(renewed, timeout, f"a renewal of lock {lock}", every=0.05)
        renewed_at = spec["renewTime"]
        if isinstance(renewed_at, str):
            renewed_at = datetime.datetime.fromisoformat(renewed_at.replace("Z", "+00:00"))
        expires = renewed_at.timestamp() + float(spec["leaseDurationSeconds"])
        return time.monotonic() + (expires - time.time())

    def jobs_seen(self) -> set[str]:
        return {job_of(pod) for pod in self.recorder.pods()}

    def works(self, job: str = "") -> list[Work]:
        """The work of every main container of `job` (all jobs by default), as it ran."""
        return self.tracker.works(f"{job}-" if job else "")

    def namespace_works(self) -> list[Work]:
        names = {pod["metadata"]["name"] for pod in self.recorder.pods()}
        return [work for work in self.tracker.works() if work.pod in names]

    def gate_exit(self, job: str, timeout: float = 90, pod: str | None = None) -> int:
        """The exit code of the gate of the Job's latest pod (or of `pod`), once it decided."""

        def decided() -> int | None:
            pods = [p for p in self.pods(job) if pod is None or p["metadata"]["name"] == pod]
            code = exit_code(pods[-1], GATE) if pods else None
            return None if code is None else code + 1000  # 0 is falsy; shifted back below

        return wait_for(decided, timeout, f"the gate of {pod or job} to decide") - 1000

    def main_running(self, job: str, timeout: float = 90) -> Work:
        return wait_for(
            lambda: next((w for w in self.works(job) if w.running), None),
            timeout,
            f"the work of {job} to run",
        )

    def main_finished(self, job: str, timeout: float = 90) -> int:
        """The exit code of the main container of the Job's latest pod, once it ended."""

        def finished() -> int | None:
            pods = self.pods(job)
            code = exit_code(pods[-1], MAIN) if pods else None
            return None if code is None else code + 1000

        return wait_for(finished, timeout, f"the main container of {job} to finish") - 1000

    def main_state(self, pod: str) -> dict[str, Any]:
        found = [p for p in self.recorder.pods() if p["metadata"]["name"] == pod]
        return container_state(found[-1], MAIN) if found else {}

    def pod_uid(self, pod: str) -> str:
        found = [p for p in self.recorder.pods() if p["metadata"]["name"] == pod]
        return str(found[-1]["metadata"]["uid"])

    def sidecar_log(self, job: str) -> str:
        """The sidecar's log of every pod of the Job (kubectl logs; kept for deleted pods)."""
        return "".join(self.recorder.sidecar_log(p["metadata"]["name"]) for p in self.pods(job))

    @contextlib.contextmanager
    def sidecar_frozen(self, pod: str) -> Iterator[None]:
        """The pod's sidecar process stopped (SIGSTOP) from the node's host, continued after."""
        pid = self.node.signal_container(self.pod_uid(pod), SIDECAR, signal.SIGSTOP)
        try:
            yield
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def finish(self, work: Work) -> None:
        """End a work running UNTIL_FINISHED: SIGUSR1 to its shell from the node's host,
        once its trap is set (CI's run of 1a627ad lost one sent before, likely: the lock
        was never given back)."""
        self.node.signal_container(self.pod_uid(work.pod), MAIN, signal.SIGUSR1, caught=True)

    def operator_log(self) -> str:
        return self.operator.log()[-4000:]


def hold_then(cluster: Scenario, name: str, **settings: str) -> tuple[Work, str, float]:
    """Start a long run of a fresh CronJob; return its work, pod and the Lease's expiry
    (on this host's monotonic clock) right after a renewal the test can act on."""
    cluster.cronjob(name, "echo working; sleep 300", **settings)
    cluster.run(name, f"{name}-1")
    work = cluster.main_running(f"{name}-1")
    expiry = cluster.wait_renewal(name)
    return work, work.pod, expiry


def stopped_before_expiry(work: Work, expiry: float, what: str) -> float:
    """Waits for the work to stop; fails unless it stopped before `expiry`; the margin."""
    stopped = wait_for(lambda: work.stopped, expiry - time.monotonic() + 60, f"{what} to stop")
    assert stopped < expiry, (
        f"{what} was still working {stopped - expiry:.1f}s after its Lease expired"
    )
    return expiry - stopped


def next_run_goes_ahead(cluster: Scenario, name: str, not_before: float) -> None:
    """Manual runs until one takes the lock: not before the old Lease expired (or was freed)."""
    count = len(cluster.jobs_seen())

    def next_run() -> str | None:
        nonlocal count
        count += 1
        job = f"{name}-{count}"
        cluster.run(name, job, "echo working again")
        return job if cluster.gate_exit(job) == 0 else None

    ran = wait_for(next_run, not_before - time.monotonic() + 90, "a later run to go ahead", 2)
    assert cluster.main_finished(ran) == 0
    assert overlapping(cluster.namespace_works()) == [], "two works of one lock at once"


def _injected(cronjob: dict[str, Any]) -> bool:
    spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return [c["name"] for c in spec.get("initContainers") or []][:2] == [SIDECAR, GATE]
