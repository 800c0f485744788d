"""End-to-end fixtures: the pod runner on the session's control plane, and a scenario helper."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import kubernetes
import pytest

from tests.conftest import ControlPlane
from tests.e2e.podrunner import PodRunner, PodWorker, ProcessRecord
from tests.kube import job_from_cronjob, wait_for
from tests.operator_process import OperatorProcess

GATE = "cronlock-gate"
SIDECAR = "cronlock"
MAIN = "main"
NEVER = "0 0 1 1 *"
EXIT_SKIPPED = 75


@pytest.fixture(scope="session")
def runner(
    controlplane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PodRunner]:
    """The test kubelet, one per session; each test tells it which namespace to serve."""
    pod_runner = PodRunner(controlplane.kubeconfig, tmp_path_factory.mktemp("podrunner"))
    pod_runner.start()
    yield pod_runner
    pod_runner.stop()


@pytest.fixture
def cluster(
    api: kubernetes.client.ApiClient,
    namespace: str,
    operator: OperatorProcess,
    runner: PodRunner,
) -> Scenario:
    """A namespace served by the runner, with the operator watching it."""
    runner.serve(namespace)
    return Scenario(api, namespace, runner, operator)


def overlapping(records: list[ProcessRecord]) -> list[tuple[ProcessRecord, ProcessRecord]]:
    """Pairs of processes whose [start, stop] intervals intersect (a running one lasts forever)."""
    pairs = []
    ordered = sorted(records, key=lambda record: record.started_monotonic)
    for index, first in enumerate(ordered):
        end = first.stopped_monotonic if first.stopped_monotonic is not None else float("inf")
        for second in ordered[index + 1 :]:
            if second.started_monotonic < end:
                pairs.append((first, second))
    return pairs


def seconds_to_next_minute() -> float:
    return 60 - time.time() % 60


@dataclass
class Scenario:
    """What a user does (CronJobs, manual runs) and sees (Jobs, Events, the Lease, logs)."""

    api: kubernetes.client.ApiClient
    namespace: str
    runner: PodRunner
    operator: OperatorProcess

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
        **settings: str,
    ) -> dict[str, Any]:
        """Create an annotated CronJob running `sh -c script`; return it once injected."""
        annotations = {"cronlock.io/enabled": "true", "cronlock.io/ttl": "15s"}
        annotations.update({f"cronlock.io/{k.replace('_', '-')}": v for k, v in settings.items()})
        body = {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                "schedule": schedule,
                "jobTemplate": {
                    "spec": {
                        "backoffLimit": backoff_limit,
                        "template": {
                            "spec": {
                                "restartPolicy": "Never",
                                "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
                                "containers": [
                                    {
                                        "name": MAIN,
                                        "image": "busybox:1.37",
                                        "command": ["sh", "-c", script],
                                    }
                                ],
                            }
                        },
                    }
                },
            },
        }
        self.batch.create_namespaced_cron_job(self.namespace, body)
        return wait_for(
            lambda: cronjob if _injected(cronjob := self.read_cronjob(name)) else None,
            timeout=30,
            what=f"the operator to inject CronJob {name}",
        )

    def run(self, cronjob: str, job: str, script: str | None = None) -> None:
        """`kubectl create job JOB --from=cronjob/CRONJOB`, optionally with another script."""
        body = job_from_cronjob(self.read_cronjob(cronjob), job)
        if script is not None:
            body = copy.deepcopy(body)
            container = body["spec"]["template"]["spec"]["containers"][0]
            container["command"] = ["sh", "-c", script]
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

    # -- what the runner saw --

    def pods(self, job: str) -> list[PodWorker]:
        return [worker for worker in self.runner.pods(self.namespace) if worker.job == job]

    def processes(self, container: str, job: str | None = None) -> list[ProcessRecord]:
        return [
            record
            for record in self.runner.processes(self.namespace, container)
            if job is None or record.job == job
        ]

    def gate_exit(self, job: str, timeout: float = 60, pod: str | None = None) -> int:
        """The exit code of the gate of the Job's latest pod (or of `pod`), once it decided."""

        def decided() -> int | None:
            gates = [r for r in self.processes(GATE, job) if pod is None or r.pod == pod]
            if gates and gates[-1].exit_code is not None:
                return gates[-1].exit_code + 1000  # 0 is falsy; shifted back below
            return None

        return wait_for(decided, timeout, f"the gate of {pod or job} to decide") - 1000

    def main_running(self, job: str, timeout: float = 60) -> ProcessRecord:
        return wait_for(
            lambda: next((r for r in self.processes(MAIN, job) if r.running), None),
            timeout,
            f"the main container of {job} to run",
        )

    def main_finished(self, job: str, timeout: float = 60) -> ProcessRecord:
        return wait_for(
            lambda: next((r for r in self.processes(MAIN, job) if not r.running), None),
            timeout,
            f"the main container of {job} to finish",
        )

    def sidecar_log(self, job: str) -> str:
        return "".join(
            self.runner.log(self.namespace, worker.name, SIDECAR) for worker in self.pods(job)
        )

    def operator_log(self) -> str:
        return self.operator.log()[-4000:]


def _injected(cronjob: dict[str, Any]) -> bool:
    spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return [c["name"] for c in spec.get("initContainers") or []][:2] == [SIDECAR, GATE]
