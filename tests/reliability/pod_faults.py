"""The pod checker's faults: what each fault kind does, from the host or the API.

`PodFaults` hits the pod that holds the Lease, its node, the API server or the operator,
and writes what happened into the `PodFault`. The checker makes one and calls `inject`
for each fault of a trial, in a thread of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import kubernetes

from cronlock_sidecar import contract
from tests.reliability import ha_faults
from tests.reliability.ha_faults import HA_FAULTS
from tests.reliability.pod_checks import injection_problems, job_of_pod, stale_settings
from tests.reliability.pod_work import (
    API_ERRORS,
    MAIN,
    NODE_FAULTS,
    POD_USER,
    PodFault,
    PodSettings,
)
from tests.support.node import CRONLOCK_IMAGE, PodRecorder, RealNode, Work
from tests.support.operator import OperatorProcess
from tests.support.processes import ControlPlaneProcesses

# preempt: the preemptor's PriorityClass (cluster-scoped, created once, kept).
PREEMPTOR_PRIORITY_CLASS = "cronlock-checker-preemptor"


class PodFaults:
    """Injects the checker's faults into the current trial's pods, nodes and control plane."""

    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        batch: kubernetes.client.BatchV1Api,
        core: kubernetes.client.CoreV1Api,
        nodes: Sequence[RealNode],
        recorder: PodRecorder,
        operator: OperatorProcess,
        namespace: str,
        settings: PodSettings,
        rng: random.Random,
        components: ControlPlaneProcesses | None,
        cronjob: Callable[[], str],
        read_cronjob: Callable[[str], dict[str, Any]],
    ) -> None:
        self.api = api
        self.batch = batch
        self.core = core
        self.nodes = list(nodes)
        # Node 1: it carries the fleet's shared pod relay (cut-pods).
        self.node = self.nodes[0]
        self.recorder = recorder
        self.operator = operator
        self.namespace = namespace
        self.settings = settings
        self.random = rng
        self.components = components
        # The current trial's CronJob name, and how the checker reads a CronJob.
        self.cronjob = cronjob
        self.read_cronjob = read_cronjob

    def inject(self, fault: PodFault, holder: Work) -> None:
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
            elif fault.kind in HA_FAULTS and self.components is not None:
                detail, fault.cleared = ha_faults.inject(
                    fault.kind, self.components, self.random, settings.ttl
                )
                fault.detail = f"{detail}, {self._work_fate(holder, fault.fired)}"
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
        name = f"preemptor-{self.cronjob()}-{secrets.token_hex(2)}"
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

    def ensure_priority_class(self) -> None:
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
            if pod["metadata"]["name"].startswith(f"{self.cronjob()}-")
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
        name = self.cronjob()
        before = self.read_cronjob(name)
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
        at_kill = self.read_cronjob(name)
        reinjected = not stale_settings(at_kill)
        fault.before_patch = not reinjected
        fault.problems += [f"at the kill: {problem}" for problem in injection_problems(at_kill)]
        restarted = time.monotonic()
        self.operator.start()
        settled_after = self._settled(name)
        if settled_after is None:
            last = self.read_cronjob(name)
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
                cronjob = self.read_cronjob(name)
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
