"""Two cronlock releases side by side, each confined by its own policies and not the other's.

A cluster of its own: the session's control plane has the test operator's release, which
watches every namespace, and a release watching every namespace admits no other (the
chart refuses it). Here release rel-a watches team-a and release rel-b watches team-b, both
installed by helm with their default policies, and each operator runs as its release's
ServiceAccount with its Deployment's own settings. Every write an operator makes (inject,
revert, its leader Lease, holder RBAC, clear a stale hold, Events) must pass; a pod's write
is judged by the policy of the release that watches its namespace, and only by it.
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from cronlock_sidecar import contract
from cronlock_sidecar.lock.model import Timing, claimed
from cronlock_sidecar.microtime import format_microtime
from tests.support import gen
from tests.support.controlplane import ControlPlane, make_service_account_kubeconfig, started
from tests.support.kube import run_tool, wait_for
from tests.support.objects import wait_event
from tests.support.operator import CHART, SIDECAR_VALUES, OperatorProcess
from tests.support.paths import ROOT
from tests.support.run_pods import job_from, pod_of

pytestmark = pytest.mark.timeout(420)

RELEASES = {"rel-a": "team-a", "rel-b": "team-b"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[ControlPlane]:
    env_dir = ROOT / ".testenv" / f"two-releases-{os.getpid()}"
    with started(env_dir) as plane:
        yield plane
    shutil.rmtree(env_dir, ignore_errors=True)


def install(plane: ControlPlane, release: str, watched: str) -> None:
    args = ["helm", "install", release, str(CHART), "-n", f"{release}-system"]
    args += ["--create-namespace", "--wait=false"]
    args += ["--set-json", f'watchNamespaces=["{watched}"]', "--set", "leaderElection.enabled=true"]
    for value in SIDECAR_VALUES:
        args += ["--set", value]
    run_tool(plane.env, *args, timeout=120, cwd=ROOT)


def operator_env(api: kubernetes.client.ApiClient, release: str) -> dict[str, str]:
    """The settings the release's Deployment gives its operator (metrics and liveness are
    turned off by OperatorProcess's own flags: the processes share this machine)."""
    deployment = kubernetes.client.AppsV1Api(api).read_namespaced_deployment(
        f"{release}-cronlock", f"{release}-system"
    )
    env = deployment.spec.template.spec.containers[0].env or []
    return {item.name: item.value for item in env if item.value is not None}


def guarded(api: kubernetes.client.ApiClient, namespace: str) -> None:
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "runs"}})
    cronjob = gen.cronjob(
        "report",
        *gen.BY_HAND,
        gen.annotated({"cronlock.io/ttl": "19s"}),
        gen.service_account("runs"),
    )
    kubernetes.client.BatchV1Api(api).create_namespaced_cron_job(namespace, cronjob)


def injected(api: kubernetes.client.ApiClient, namespace: str) -> bool:
    body = kubernetes.client.BatchV1Api(api).read_namespaced_cron_job("report", namespace)
    init = body.spec.job_template.spec.template.spec.init_containers or []
    return any(container.name == "cronlock" for container in init)


def holder_of(api: kubernetes.client.ApiClient, namespace: str, name: str) -> str:
    lease = kubernetes.client.CoordinationV1Api(api).read_namespaced_lease(name, namespace)
    return str(lease.spec.holder_identity or "")


def test_two_releases_each_do_every_operator_write_and_judge_only_their_own_namespaces(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    api = cluster.api_client()
    core = kubernetes.client.CoreV1Api(api)
    leases = kubernetes.client.CoordinationV1Api(api)
    for namespace in RELEASES.values():
        core.create_namespace({"metadata": {"name": namespace}})
    for release, namespace in RELEASES.items():
        install(cluster, release, namespace)
    operators = []
    for release in RELEASES:
        kubeconfig = make_service_account_kubeconfig(
            cluster, api, f"{release}-system", f"{release}-cronlock", tmp_path
        )
        process = OperatorProcess(
            kubeconfig,
            tmp_path / f"{release}.log",
            {**cluster.env, **operator_env(api, release)},
        )
        operators.append(process)
    try:
        for process in operators:
            process.start()
        for release in RELEASES:
            wait_for(
                lambda release=release: holder_of(
                    api, f"{release}-system", f"{release}-cronlock-leader"
                ),
                60,
                f"{release}'s operator to lead",
            )
        for namespace in RELEASES.values():
            guarded(api, namespace)
        for namespace in RELEASES.values():
            wait_for(lambda namespace=namespace: injected(api, namespace), 60, "injection")
            wait_event(api, namespace, "report", "Injected")
            roles = kubernetes.client.RbacAuthorizationV1Api(api).list_namespaced_role(namespace)
            assert [role.metadata.name for role in roles.items] == ["cronlock-holder-runs"]

        # A stale hold in each namespace (an admin's write: no policy judges it) is cleared
        # by the release watching it, after the lock's 19 s ttl plus the skew.
        stamp = format_microtime(datetime.datetime.now(datetime.UTC))
        for namespace in RELEASES.values():
            leases.patch_namespaced_lease(
                "cronlock-report",
                namespace,
                {
                    "spec": {
                        "holderIdentity": "gone-12345_abcdefgh",
                        "acquireTime": stamp,
                        "renewTime": stamp,
                        "leaseDurationSeconds": 19,
                    }
                },
            )
        for namespace in RELEASES.values():
            wait_for(
                lambda namespace=namespace: not holder_of(api, namespace, "cronlock-report"),
                60,
                f"the stale hold in {namespace} to be cleared",
            )
            wait_event(api, namespace, "report", "LeaseExpired")

        # A run's pod in team-b claims as itself, judged by rel-b's policy alone; an
        # intruder there is refused by rel-b's policy, not rel-a's.
        run = _pod(cluster, api, "team-b", "report-29000000-abcde", tmp_path)
        intruder = _pod(cluster, api, "team-b", "intruder", tmp_path)
        run_leases = kubernetes.client.CoordinationV1Api(cluster.api_client(run[1]))
        intruder_leases = kubernetes.client.CoordinationV1Api(cluster.api_client(intruder[1]))

        def claim(pod_leases: Any, identity: str) -> None:
            current = api.sanitize_for_serialization(
                pod_leases.read_namespaced_lease("cronlock-report", "team-b")
            )
            body = claimed(
                current,
                identity,
                Timing.of(19),
                datetime.datetime.now(datetime.UTC),
                "report-29000000",
            )
            pod_leases.replace_namespaced_lease("cronlock-report", "team-b", body)

        wait_for(lambda: _can_read(run_leases), 30, "the holder Role in team-b")
        with pytest.raises(kubernetes.client.ApiException) as denied:
            claim(intruder_leases, run[0])
        assert denied.value.status == 403
        assert "rel-b-cronlock-rel-b-system-lease-holders" in str(denied.value.body)
        claim(run_leases, run[0])
        assert holder_of(api, "team-b", "cronlock-report") == run[0]

        # Revert on opt-out, by each.
        for namespace in RELEASES.values():
            kubernetes.client.BatchV1Api(api).patch_namespaced_cron_job(
                "report", namespace, {"metadata": {"annotations": {"cronlock.io/enabled": None}}}
            )
        for namespace in RELEASES.values():
            wait_for(lambda namespace=namespace: not injected(api, namespace), 60, "revert")
            wait_event(api, namespace, "report", "Reverted")
    finally:
        for process in operators:
            process.stop()
    for process in operators:
        # Without the lines' timestamps, whose milliseconds can read 403 too.
        messages = re.sub(r"(?m)^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", "", process.log())
        assert "403" not in messages, process.log()[-3000:]
        assert "Forbidden" not in messages, process.log()[-3000:]
    api.close()


def _pod(
    plane: ControlPlane, api: kubernetes.client.ApiClient, namespace: str, name: str, tmp: Path
) -> tuple[str, Path]:
    """A never-started pod on the account `runs`: its holder identity and a kubeconfig with
    a token bound to it, as the kubelet's. `report-<n>-abcde` gives a run's pod (the Job
    controller's, of a Job `report-<n>` made from the CronJob, named with 5 random
    characters): the operator breaks a hold by any other pod (reconcile/holders.py)."""
    if name.startswith("report-"):
        job = name.rsplit("-", 1)[0]
        job_from(api, namespace, "report", job)
        pod = pod_of(api, namespace, job)
        name, uid = pod.metadata.name, pod.metadata.uid
    else:
        created = kubernetes.client.CoreV1Api(api).create_namespaced_pod(
            namespace, gen.pod(name, "runs")
        )
        uid = created.metadata.uid
    path = make_service_account_kubeconfig(
        plane, api, namespace, "runs", tmp, bound_pod=(name, uid)
    )
    return contract.holder_identity(name, uid), path


def _can_read(pod_leases: Any) -> bool:
    try:
        pod_leases.read_namespaced_lease("cronlock-report", "team-b")
    except kubernetes.client.ApiException as error:
        if error.status in (403, 404):
            return False
        raise
    return True
