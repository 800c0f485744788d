"""A tick's success on its Lease (issue 56 item 3): the operator records it from the Job's
outcome, the next run's work reads it, and no pod writes or drops it.

Real kube-apiserver and kube-controller-manager with the chart's holders' policy and the
real operator; the runs' pods are the Job controller's, finished through the status
subresource as a kubelet would report them, and each claims the Lease with the sidecar's
own LeaseKeeper on its pod-bound token.
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
from cronlock_sidecar.lock import ticks
from cronlock_sidecar.lock.model import Timing, released
from cronlock_sidecar.transport.kubeapi import KubeLeaseClient
from cronlock_sidecar.transport.kubeconfig import from_kubeconfig
from cronlock_sidecar.transport.seam import Forbidden, LeaseRef
from tests.support import gen
from tests.support.controlplane import ControlPlane, make_service_account_kubeconfig
from tests.support.cronjobs import job_from_cronjob
from tests.support.kube import finish_pod, wait_for
from tests.support.objects import batch, read

pytestmark = pytest.mark.usefixtures("operator")

LEASE = "cronlock-nightly"
SUCCEEDED = "cronlock.io/succeeded.nightly"


def guarded(api: kubernetes.client.ApiClient, namespace: str) -> dict[str, Any]:
    """The CronJob `nightly` on the account `runs`, injected; its Job fails at once."""
    kubernetes.client.CoreV1Api(api).create_namespaced_service_account(
        namespace, {"metadata": {"name": "runs"}}
    )
    body = gen.cronjob(
        "nightly", *gen.BY_HAND, gen.service_account("runs"), gen.with_job(backoffLimit=0)
    )
    batch(api).create_namespaced_cron_job(namespace, body)

    def injected() -> dict[str, Any] | None:
        current = read(api, namespace, "nightly")
        pod = current["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        names = [container["name"] for container in pod.get("initContainers") or []]
        return current if contract.SIDECAR_CONTAINER in names else None

    return wait_for(injected, 30, "the CronJob to be injected")


class Run:
    """One tick's Job, its pod and the pod's token, as the sidecar would hold the Lease."""

    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        controlplane: ControlPlane,
        namespace: str,
        cronjob: dict[str, Any],
        at: datetime.datetime,
        directory: Path,
    ) -> None:
        self.api, self.namespace = api, namespace
        self.job = f"nightly-{int(at.timestamp()) // 60}"
        created = batch(api).create_namespaced_job(namespace, job_from_cronjob(cronjob, self.job))
        self.uid = str(created.metadata.uid)
        core = kubernetes.client.CoreV1Api(api)
        pod = wait_for(
            lambda: (
                core.list_namespaced_pod(namespace, label_selector=f"job-name={self.job}").items
            ),
            30,
            f"the Job controller to create a pod for {self.job}",
        )[0]
        self.pod = str(pod.metadata.name)
        self.identity = contract.holder_identity(self.pod, pod.metadata.uid)
        self.kubeconfig = make_service_account_kubeconfig(
            controlplane, api, namespace, "runs", directory, bound_pod=(self.pod, pod.metadata.uid)
        )
        self.tick = ticks.Tick("nightly", at, self.job, self.uid)
        self.leases = kubernetes.client.CoordinationV1Api(controlplane.api_client(self.kubeconfig))

    def keeper(self, client: KubeLeaseClient) -> LeaseKeeper:
        return LeaseKeeper(
            client,
            LeaseRef(self.namespace, LEASE),
            self.identity,
            Timing.of(60),
            SystemClock(),
            self.job,
            tick=self.tick,
        )

    def claim(self) -> tuple[LeaseKeeper, KubeLeaseClient]:
        client = KubeLeaseClient(from_kubeconfig([self.kubeconfig]))
        keeper = self.keeper(client)
        try:
            assert isinstance(keeper.try_acquire(), Acquired)
        except BaseException:
            client.close()
            raise
        return keeper, client

    def write(self, change: Callable[[dict[str, Any]], None], **options: str) -> None:
        """Read the Lease, change it, write it back with this pod's token."""
        lease = self.api.sanitize_for_serialization(
            self.leases.read_namespaced_lease(LEASE, self.namespace)
        )
        change(lease)
        self.leases.replace_namespaced_lease(LEASE, self.namespace, lease, **options)

    def refused_now(self, change: Callable[[dict[str, Any]], None]) -> bool:
        """Whether the policy refuses `change` already (a dry run: nothing is written)."""
        try:
            self.write(change, dry_run="All")
        except kubernetes.client.ApiException as error:
            return error.status == 403 and "tick's success" in str(error.body)
        return False

    def refused(self, change: Callable[[dict[str, Any]], None]) -> str:
        with pytest.raises(kubernetes.client.ApiException) as denied:
            self.write(change)
        assert denied.value.status == 403, denied.value.body
        body = str(denied.value.body)
        assert "cronlock holder policy: only the operator records a tick's success" in body, body
        return body

    def finish(self, main_exit: int) -> None:
        finish_pod(
            kubernetes.client.CoreV1Api(self.api),
            self.namespace,
            self.pod,
            gate_exit=0,
            main_exit=main_exit,
        )

    def accounted(self) -> bool:
        job = batch(self.api).read_namespaced_job(self.job, self.namespace)
        return "cronlock.io/accounted" in (job.metadata.annotations or {})


def notes(api: kubernetes.client.ApiClient, namespace: str) -> dict[str, str]:
    lease = kubernetes.client.CoordinationV1Api(api).read_namespaced_lease(LEASE, namespace)
    return dict(lease.metadata.annotations or {})


def success(api: kubernetes.client.ApiClient, namespace: str) -> ticks.TickRecord | None:
    return ticks.read_success(notes(api, namespace), "nightly")


def minutes_ago(minutes: int) -> datetime.datetime:
    now = datetime.datetime.now(datetime.UTC).replace(second=0, microsecond=0)
    return now - datetime.timedelta(minutes=minutes)


def test_the_operator_records_a_ticks_success_and_no_pod_can(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    tmp_path: Path,
) -> None:
    cronjob = guarded(api, namespace)

    # Tick 1 claims, and its pod tries to write its own success: refused in every form.
    first = Run(api, controlplane, namespace, cronjob, minutes_ago(3), tmp_path)
    keeper, client = wait_for(lambda: _claimed(first), 30, "the holder Role for `runs`")
    try:
        mine = ticks.read_record(notes(api, namespace), "nightly")
        assert mine == ticks.record_of(first.tick, first.identity, "")
        claim_text = mine.text()

        def release_with_success(lease: dict[str, Any]) -> None:
            now = datetime.datetime.now(datetime.UTC)
            lease.update(released(lease, first.identity, now, success=mine))

        def renew_with_success(lease: dict[str, Any]) -> None:
            lease["metadata"]["annotations"][SUCCEEDED] = claim_text

        wait_for(lambda: first.refused_now(renew_with_success), 30, "the holders' policy")
        first.refused(release_with_success)
        first.refused(renew_with_success)
        assert keeper.release(), "the release without a success record passes"
    finally:
        client.close()
    assert success(api, namespace) is None

    # The Job succeeds: the operator records the tick as the last success, as claimed.
    first.finish(main_exit=0)
    recorded = wait_for(lambda: success(api, namespace), 60, "the operator's success record")
    assert recorded == mine
    assert notes(api, namespace)[SUCCEEDED] == claim_text

    # No pod drops or rewinds it, not even the run it names.
    def dropped(lease: dict[str, Any]) -> None:
        lease["metadata"]["annotations"].pop(SUCCEEDED)

    def rewound(lease: dict[str, Any]) -> None:
        older = mine._replace(at=mine.at - datetime.timedelta(minutes=10))
        lease["metadata"]["annotations"][SUCCEEDED] = older.text()

    first.refused(dropped)
    first.refused(rewound)

    # Tick 2 claims, reads tick 1 as both its previous and its last successful tick, and
    # fails: the success record stays tick 1's.
    second = Run(api, controlplane, namespace, cronjob, minutes_ago(2), tmp_path)
    keeper, client = second.claim()
    try:
        assert keeper.previous_tick == mine
        assert keeper.last_success == mine
        assert keeper.release()
    finally:
        client.close()
    second.finish(main_exit=1)
    wait_for(second.accounted, 60, "the failed Job counted")
    assert success(api, namespace) == mine, "a failed tick does not move the last success"

    # Tick 3 is told: the previous tick is 2 (it failed), the last success is still 1.
    third = Run(api, controlplane, namespace, cronjob, minutes_ago(1), tmp_path)
    keeper, client = third.claim()
    try:
        previous = keeper.previous_tick
        assert previous is not None
        assert previous.at == second.tick.at
        assert keeper.last_success == mine
        assert keeper.release()
    finally:
        client.close()
    third.finish(main_exit=0)
    moved = wait_for(
        lambda: s if (s := success(api, namespace)) is not None and s.at == third.tick.at else None,
        60,
        "the success record moved to tick 3",
    )
    assert (moved.job, moved.run, moved.holder) == (third.job, third.uid, third.identity)


def _claimed(run: Run) -> tuple[LeaseKeeper, KubeLeaseClient] | None:
    """The claim once the holder Role lets the pod's token write the Lease."""
    try:
        return run.claim()
    except Forbidden:  # until the operator's holder Role for `runs` exists
        return None
