"""A pod that is no run holds the lock for a moment only: the run after it goes ahead.

Security review 2026-12-05 N4 (§8 item 1), on the real node: a CronJob whose pods run as
`default` (annotated, its author's choice), and another pod on `default` that claims the
free Lease in its own name with the token the kubelet would mount for it. The operator
breaks that hold; a manual run then works, and while it holds, the pod's claims are
refused."""

from __future__ import annotations

from pathlib import Path

import kubernetes
import pytest

from cronlock_sidecar import contract
from tests.e2e.scenario import UNTIL_FINISHED, Scenario
from tests.support.controlplane import ControlPlane, make_service_account_kubeconfig
from tests.support.kube import wait_for
from tests.support.leases import claim_free_lease


def test_a_pod_on_the_runs_account_cannot_keep_the_lock_and_the_run_goes_ahead(
    cluster: Scenario, controlplane: ControlPlane, tmp_path: Path
) -> None:
    # The run holds until the test ends it, after the web app's claim was refused.
    cluster.cronjob("backup", f"echo backup; {UNTIL_FINISHED}")
    namespace = cluster.namespace
    # The web app: a pod on `default` that never starts here (no node matches it).
    wait_for(
        lambda: (
            cluster.core.list_namespaced_service_account(
                namespace, field_selector="metadata.name=default"
            ).items
        ),
        30,
        "the namespace's ServiceAccount default",
    )
    web = cluster.core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "web-7f9c"},
            "spec": {
                "nodeSelector": {"example.com/nowhere": "true"},
                "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
                "containers": [{"name": "web", "image": "busybox:never-pulled"}],
            },
        },
    )
    path = make_service_account_kubeconfig(
        controlplane,
        cluster.api,
        namespace,
        "default",
        tmp_path,
        bound_pod=(web.metadata.name, web.metadata.uid),
    )
    as_web = kubernetes.client.CoordinationV1Api(controlplane.api_client(path))
    identity = contract.holder_identity(web.metadata.name, web.metadata.uid)

    claim_free_lease(as_web, namespace, "cronlock-backup", identity)
    wait_for(
        lambda: not cluster.lease("backup")["spec"].get("holderIdentity"),
        20,
        "the operator to break the web app's hold",
    )
    [(kind, message)] = cluster.wait_event("backup", "ForeignHolder")
    assert kind == "Warning"
    assert identity in message

    cluster.run("backup", "backup-1")
    assert cluster.gate_exit("backup-1") == 0, "the run was not skipped"
    work = cluster.main_running("backup-1")
    with pytest.raises(kubernetes.client.ApiException) as refused:
        claim_free_lease(as_web, namespace, "cronlock-backup", identity)
    assert refused.value.status == 403
    assert "the Lease is held by backup-1-" in str(refused.value.body)
    assert work.running, "the claim was refused while the run held the lock"
    cluster.finish(work)
    assert cluster.main_finished("backup-1", timeout=60) == 0
    assert cluster.consecutive_skips("backup") == 0
    assert len(cluster.events("backup", "ForeignHolder")) == 1, "the run's hold was kept"
