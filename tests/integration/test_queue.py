"""policy: queue (issue 58 item 2): a queued run is a suspended Job with no pod, let go by
the operator one at a time, oldest first, when the lock is released; newer ticks collapse,
and a Job queued too long is dropped.

Real kube-apiserver and kube-controller-manager (the CronJob controller's template, the Job
controller's pods) with the chart's policies and the real operator; each run's pod claims
and releases the Lease with the sidecar's own LeaseKeeper on its pod-bound token.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from cronlock_sidecar import contract
from cronlock_sidecar.holding.lease import Acquired, LeaseKeeper, SystemClock
from cronlock_sidecar.lock.model import Timing
from cronlock_sidecar.microtime import format_microtime
from cronlock_sidecar.transport.kubeapi import KubeLeaseClient
from cronlock_sidecar.transport.kubeconfig import from_kubeconfig
from cronlock_sidecar.transport.seam import Forbidden, LeaseRef
from tests.support import gen
from tests.support.controlplane import ControlPlane, make_service_account_kubeconfig
from tests.support.cronjobs import job_from_cronjob
from tests.support.kube import holds, wait_for
from tests.support.objects import batch, events, read, wait_event

pytestmark = pytest.mark.usefixtures("operator")


def queued_cronjob(
    api: kubernetes.client.ApiClient, namespace: str, name: str, **notes: str
) -> dict[str, Any]:
    """The CronJob `name` under policy: queue on the account `runs`, once injected."""
    core = kubernetes.client.CoreV1Api(api)
    if not core.list_namespaced_service_account(
        namespace, field_selector="metadata.name=runs"
    ).items:
        core.create_namespaced_service_account(namespace, {"metadata": {"name": "runs"}})
    body = gen.cronjob(
        name,
        *gen.BY_HAND,
        gen.service_account("runs"),
        gen.with_job(backoffLimit=0),
        gen.annotated({"cronlock.io/policy": "queue", "cronlock.io/lock": "shared", **notes}),
    )
    batch(api).create_namespaced_cron_job(namespace, body)

    def injected() -> dict[str, Any] | None:
        current = read(api, namespace, name)
        pod = current["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        names = [container["name"] for container in pod.get("initContainers") or []]
        return current if contract.SIDECAR_CONTAINER in names else None

    return wait_for(injected, 30, f"{name} to be injected")


def pods_of(api: kubernetes.client.ApiClient, namespace: str, job: str) -> list[Any]:
    core = kubernetes.client.CoreV1Api(api)
    return list(core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items)


def suspended(api: kubernetes.client.ApiClient, namespace: str, job: str) -> bool:
    return bool(batch(api).read_namespaced_job(job, namespace).spec.suspend)


class Run:
    """A queued Job's pod once let go, holding the lock as its sidecar would."""

    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        controlplane: ControlPlane,
        namespace: str,
        job: str,
        directory: Path,
    ) -> None:
        pod = wait_for(lambda: pods_of(api, namespace, job), 30, f"a pod for {job}")[0]
        self.job = job
        self.identity = contract.holder_identity(pod.metadata.name, pod.metadata.uid)
        kubeconfig = make_service_account_kubeconfig(
            controlplane,
            api,
            namespace,
            "runs",
            directory / job,
            bound_pod=(pod.metadata.name, pod.metadata.uid),
        )
        self.kubeconfig = kubeconfig
        self.client = KubeLeaseClient(from_kubeconfig([kubeconfig]))
        self.keeper = LeaseKeeper(
            self.client,
            LeaseRef(namespace, "cronlock-shared"),
            self.identity,
            Timing.of(60),
            SystemClock(),
            job,
        )

    def claim(self) -> bool:
        try:
            return isinstance(self.keeper.try_acquire(), Acquired)
        except Forbidden:  # until the operator's holder Role for `runs` exists
            return False

    def release(self) -> None:
        assert self.keeper.release()
        self.client.close()


def test_queued_runs_have_no_pod_and_go_one_at_a_time_in_creation_order(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    tmp_path: Path,
) -> None:
    cronjob = queued_cronjob(api, namespace, "report")
    assert cronjob["spec"]["jobTemplate"]["spec"]["suspend"] is True
    # GitOps: the field is cronlock's (managedFieldsManagers: [cronlock] ignores it).
    (ours,) = [e for e in cronjob["metadata"]["managedFields"] if e["manager"] == "cronlock"]
    assert "f:suspend" in ours["fieldsV1"]["f:spec"]["f:jobTemplate"]["f:spec"]
    make = batch(api).create_namespaced_job
    tmp_path.joinpath("report-1").mkdir()

    # The lock is free: the first manual run is let go at once and its pod holds the lock.
    make(namespace, job_from_cronjob(cronjob, "report-1"))
    first = Run(api, controlplane, namespace, "report-1", tmp_path)
    wait_for(first.claim, 30, "report-1's pod to hold the lock")
    assert "Dequeued" in [reason for _, reason, _ in events(api, namespace, "report")]

    # Two more queue behind it: suspended, and no pod exists for either.
    for name in ("report-2", "report-3"):
        make(namespace, job_from_cronjob(cronjob, name))
        tmp_path.joinpath(name).mkdir()

    def still_queued() -> bool:
        return all(
            suspended(api, namespace, job) and not pods_of(api, namespace, job)
            for job in ("report-2", "report-3")
        )

    holds(still_queued, 3, "report-2 and report-3 queued without pods while report-1 holds")

    # A pod on the runs' account (report-1's, with its pod-bound token) cannot touch the
    # queue: no Job verb is granted to it, so it can neither let a queued Job go nor drop one.
    attacker = kubernetes.config.new_client_from_config(config_file=str(first.kubeconfig))
    jobs = batch(attacker)
    attempts: list[Callable[[], object]] = [
        lambda: jobs.patch_namespaced_job("report-3", namespace, {"spec": {"suspend": False}}),
        lambda: jobs.delete_namespaced_job("report-2", namespace),
        lambda: jobs.create_namespaced_job(namespace, job_from_cronjob(cronjob, "report-9")),
    ]
    for attempt in attempts:
        with pytest.raises(kubernetes.client.ApiException) as refused:
            attempt()
        assert refused.value.status == 403, refused.value.body
    attacker.close()
    assert still_queued()

    # report-1 releases: only the oldest queued one goes.
    first.release()
    second = Run(api, controlplane, namespace, "report-2", tmp_path)
    assert suspended(api, namespace, "report-3")
    assert not pods_of(api, namespace, "report-3")
    wait_for(second.claim, 30, "report-2's pod to hold the lock")
    holds(
        lambda: suspended(api, namespace, "report-3") and not pods_of(api, namespace, "report-3"),
        2,
        "report-3 queued while report-2 holds",
    )
    second.release()
    third = Run(api, controlplane, namespace, "report-3", tmp_path)
    wait_for(third.claim, 30, "report-3's pod to hold the lock")
    third.release()
    assert len(wait_event(api, namespace, "report", "Dequeued", count=3)) == 3


def test_newer_ticks_collapse_into_the_queued_one_which_is_dropped_at_its_timeout(
    api: kubernetes.client.ApiClient, namespace: str
) -> None:
    cronjob = queued_cronjob(api, namespace, "digest", **{"cronlock.io/queue-timeout": "8s"})
    hold_as_admin(api, namespace)
    now = datetime.datetime.now(datetime.UTC)
    minute = int(now.timestamp()) // 60
    older, newer = f"digest-{minute - 2}", f"digest-{minute - 1}"
    batch(api).create_namespaced_job(namespace, job_from_cronjob(cronjob, older))
    batch(api).create_namespaced_job(namespace, job_from_cronjob(cronjob, newer))

    def gone(job: str) -> bool:
        try:
            batch(api).read_namespaced_job(job, namespace)
        except kubernetes.client.ApiException as error:
            return error.status == 404
        return False

    wait_for(lambda: gone(newer), 30, f"{newer} collapsed")
    found = wait_event(api, namespace, "digest", "Collapsed")
    assert len(found) == 1, events(api, namespace, "digest")
    (collapsed,) = found
    assert newer in collapsed
    assert older in collapsed
    assert suspended(api, namespace, older)
    assert not pods_of(api, namespace, older)

    wait_for(lambda: gone(older), 30, f"{older} dropped at its queue timeout")
    found = wait_event(api, namespace, "digest", "QueueTimedOut")
    assert len(found) == 1, events(api, namespace, "digest")
    (timed_out,) = found
    assert older in timed_out
    warnings = [
        kind for kind, reason, _ in events(api, namespace, "digest") if reason == "QueueTimedOut"
    ]
    assert warnings == ["Warning"]
    assert not pods_of(api, namespace, older)
    # Counted as a skip in a row (RepeatedSkips at alert-after), as a held lock's skip is.
    wait_for(
        lambda: (
            (read(api, namespace, "digest")["metadata"].get("annotations") or {}).get(
                "cronlock.io/consecutive-skips"
            )
            == "1"
        ),
        30,
        "the timed-out run counted as one skip in a row",
    )


def refused(call: Callable[[], Any]) -> str:
    with pytest.raises(kubernetes.client.ApiException) as caught:
        call()
    assert caught.value.status in (403, 422), caught.value.body
    return str(caught.value.body)


RESUME = [
    {"op": "test", "path": "/spec/suspend", "value": True},
    {"op": "replace", "path": "/spec/suspend", "value": False},
]


def test_the_operators_token_may_let_go_a_queued_job_and_do_nothing_else_with_jobs(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    operator_kubeconfig: Path,
) -> None:
    """The one new write of policy: queue, spec.suspend true to false on a Job whose
    CronJob runs its sidecar under queue, and nothing beside it (the operator-scope
    policy), tried with the operator's own token; dry runs, so nothing changes."""
    cronjob = queued_cronjob(api, namespace, "ledger")
    hold_as_admin(api, namespace)
    admin = batch(api)
    as_operator = batch(controlplane.api_client(operator_kubeconfig))
    admin.create_namespaced_job(namespace, job_from_cronjob(cronjob, "ledger-1"))
    json_patch = "application/json-patch+json"

    def patch(name: str, body: Any, content_type: str = json_patch) -> Any:
        return as_operator.patch_namespaced_job(
            name, namespace, body, _content_type=content_type, dry_run="All"
        )

    # The legitimate write passes.
    patch("ledger-1", RESUME)
    # Anything else with it, or alone, is refused.
    message = "queued Job go"
    for extra in (
        {"op": "add", "path": "/spec/activeDeadlineSeconds", "value": 1},
        {"op": "replace", "path": "/spec/backoffLimit", "value": 50},
        # a suspended Job's placement is mutable to the API server (Kueue's use), not to us
        {
            "op": "add",
            "path": "/spec/template/spec/nodeSelector",
            "value": {"kubernetes.io/hostname": "db-1"},
        },
    ):
        assert message in refused(lambda extra=extra: patch("ledger-1", [*RESUME, extra]))
    # A running queue Job cannot be suspended (its pod killed) by the operator's token.
    admin.patch_namespaced_job("ledger-1", namespace, {"spec": {"suspend": False}})
    refused(lambda: patch("ledger-1", [{"op": "replace", "path": "/spec/suspend", "value": True}]))
    # The same Job without a CronJob controlling it (made by hand from the template): no.
    orphan = job_from_cronjob(cronjob, "ledger-orphan")
    orphan["metadata"].pop("ownerReferences")
    admin.create_namespaced_job(namespace, orphan)
    refused(lambda: patch("ledger-orphan", RESUME))
    # A suspended Job of a guarded CronJob not under queue (labelled with a lock, its
    # sidecar under skip): its suspend is its owner's, not the operator's.
    skip = gen.cronjob(
        "payroll",
        *gen.BY_HAND,
        gen.service_account("runs"),
        gen.annotated({"cronlock.io/lock": "payroll"}),
    )
    admin.create_namespaced_cron_job(namespace, skip)
    injected = wait_for(
        lambda: (
            c
            if (c := read(api, namespace, "payroll"))["spec"]["jobTemplate"]["spec"]["template"][
                "spec"
            ].get("initContainers")
            else None
        ),
        30,
        "payroll injected",
    )
    paused = job_from_cronjob(injected, "payroll-1")
    paused["spec"]["suspend"] = True
    admin.create_namespaced_job(namespace, paused)
    refused(lambda: patch("payroll-1", RESUME))
    # And on CronJobs: suspend only with the queue sidecar, added or removed with it.
    cronjobs = kubernetes.client.BatchV1Api(controlplane.api_client(operator_kubeconfig))

    def patch_cronjob(name: str, ops: list[dict[str, Any]]) -> Any:
        return cronjobs.patch_namespaced_cron_job(
            name, namespace, ops, _content_type=json_patch, dry_run="All"
        )

    assert "suspend (set under policy: queue" in refused(
        lambda: patch_cronjob(
            "payroll", [{"op": "add", "path": "/spec/jobTemplate/spec/suspend", "value": True}]
        )
    )
    refused(
        lambda: patch_cronjob(
            "ledger", [{"op": "remove", "path": "/spec/jobTemplate/spec/suspend"}]
        )
    )


def hold_as_admin(api: kubernetes.client.ApiClient, namespace: str) -> None:
    """The lock held by someone outside the cluster's pods (a `run` process, an admin)."""
    now = datetime.datetime.now(datetime.UTC)
    leases = kubernetes.client.CoordinationV1Api(api)
    wait_for(
        lambda: (
            leases.list_namespaced_lease(
                namespace, field_selector="metadata.name=cronlock-shared"
            ).items
        ),
        30,
        "the lock's Lease",
    )
    leases.patch_namespaced_lease(
        "cronlock-shared",
        namespace,
        {
            "spec": {
                "holderIdentity": "backup-host_4242_abcdef",
                "acquireTime": format_microtime(now),
                "renewTime": format_microtime(now),
                "leaseDurationSeconds": 60,
            }
        },
    )
