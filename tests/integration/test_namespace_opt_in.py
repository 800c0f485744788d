"""Namespace opt-in on the real API server, the operator running as the chart's
ServiceAccount with exactly the chart's RBAC: the label cronlock.io/enabled=true on a
namespace guards every CronJob in it but one annotated "false"; removed, it gives each back
exactly as written. The label added and removed while the CronJobs exist, a CronJob
created while it is there, an operator restarted while it is there (no revert at start),
and what the operator's own token may do with namespaces (read, never write).

Security review N4, from the attacker's side: the label alone hands no lock to `default`
(the account of every pod that names none) and imposes no `stop: signal`; and a pod on a
granted account that is no run of the lock has its hold broken at once, with an Event,
while a run's hold (a Job made by kubectl create job --from) is kept."""

from __future__ import annotations

import datetime
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from cronlock_sidecar import contract
from cronlock_sidecar.microtime import format_microtime
from tests.support import gen
from tests.support.controlplane import ControlPlane, make_service_account_kubeconfig
from tests.support.kube import holds, wait_for
from tests.support.leases import claim_free_lease
from tests.support.objects import batch, comparable, events, has_sidecar, read, wait_event
from tests.support.operator import OperatorProcess
from tests.support.run_pods import job_from, pod_of

pytestmark = pytest.mark.usefixtures("operator")
LABEL = "cronlock.io/enabled"
BIN = Path(__file__).resolve().parents[2] / ".venv" / "bin"


def label(api: kubernetes.client.ApiClient, namespace: str, value: str | None) -> None:
    kubernetes.client.CoreV1Api(api).patch_namespace(
        namespace, {"metadata": {"labels": {LABEL: value}}}
    )


def create(
    api: kubernetes.client.ApiClient,
    namespace: str,
    name: str,
    *,
    account: str | None = "runs",
    containers: list[dict[str, Any]] | None = None,
    due: bool = True,
    **notes: str,
) -> str:
    """The CronJob, its pods on `account` (None: no serviceAccountName, so `default`); its
    resourceVersion as created. `due=False`: a schedule that never comes, so the CronJob
    controller never writes its status either."""
    body = gen.cronjob(
        name,
        *([] if due else [gen.never_due()]),
        gen.in_namespace(namespace),
        gen.with_annotations(notes),
        gen.restart_policy("Never"),
        *([] if containers is None else [gen.containers(*containers)]),
        *([] if account is None else [gen.service_account(account)]),
    )
    created = batch(api).create_namespaced_cron_job(namespace, body)
    return str(created.metadata.resource_version)


def wait_injected(api: kubernetes.client.ApiClient, namespace: str, *names: str) -> None:
    for name in names:
        wait_for(lambda n=name: has_sidecar(read(api, namespace, n)), 30, f"{name} injected")


def test_the_label_guards_a_namespaces_cronjobs_and_removed_gives_them_back(
    api: kubernetes.client.ApiClient, namespace: str, controlplane: ControlPlane
) -> None:
    create(api, namespace, "own", **{LABEL: "true"})
    create(api, namespace, "plain")
    create(api, namespace, "out", **{LABEL: "false"})
    wait_injected(api, namespace, "own")
    written = {name: comparable(read(api, namespace, name)) for name in ("plain", "out")}
    assert not has_sidecar(read(api, namespace, "plain")), "no label yet: not guarded"

    label(api, namespace, "true")
    wait_injected(api, namespace, "plain")
    create(api, namespace, "late")  # while the label is there
    wait_injected(api, namespace, "late")
    leases = kubernetes.client.CoordinationV1Api(api).list_namespaced_lease(namespace).items
    assert {lease.metadata.name for lease in leases} == {
        "cronlock-own",
        "cronlock-plain",
        "cronlock-late",
    }
    # The one annotated "false" opted out: never written to.
    assert comparable(read(api, namespace, "out")) == written["out"]

    # cronlock status shows which rule guards each (the admin may read namespaces).
    shown = subprocess.run(
        [str(BIN / "cronlock"), "status", "-n", namespace, "-o", "json"],
        env=controlplane.env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    guarded = {item["cronjob"]: item["guardedBy"] for item in json.loads(shown.stdout)["items"]}
    assert guarded == {"own": "annotation", "plain": "namespace", "late": "namespace"}

    label(api, namespace, None)
    wait_for(
        lambda: comparable(read(api, namespace, "plain")) == written["plain"],
        30,
        "plain reverted exactly as written",
    )
    wait_for(lambda: not has_sidecar(read(api, namespace, "late")), 30, "late reverted")
    assert has_sidecar(read(api, namespace, "own")), "its own annotation still guards it"
    assert comparable(read(api, namespace, "out")) == written["out"]


def test_an_operator_started_while_a_namespace_is_labelled_reverts_nothing(
    api: kubernetes.client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """A restart neither reverts a CronJob its namespace guards nor writes it at all: the
    namespace watch is registered at every start, and the labels are read before the first
    CronJob is decided (that order, which the watches' own timing mostly hides, is kept by
    tests/unit/operator/test_runtime.py)."""
    label(api, namespace, "true")
    # Never due: every write to it is the operator's (on */5 the CronJob controller's status
    # write at a five-minute tick failed this test once, in a fresh full run).
    create(api, namespace, "plain", due=False)
    wait_injected(api, namespace, "plain")
    version = read(api, namespace, "plain")["metadata"]["resourceVersion"]
    operator.restart()
    create(api, namespace, "after")  # decided only once the restarted operator runs
    wait_injected(api, namespace, "after")
    # "after" injected: its first pass over every CronJob is done, and "plain" stays as
    # it was over a window that could show a late write.
    holds(
        lambda: read(api, namespace, "plain")["metadata"]["resourceVersion"] == version,
        2,
        "the restarted operator leaves plain unwritten",
    )


def test_the_operators_token_reads_namespaces_and_writes_none(
    controlplane: ControlPlane, operator_kubeconfig: Path, namespace: str
) -> None:
    """What the chart grants for namespace opt-in: get, list and watch; the label is the
    cluster admin's to set, never the operator's."""
    core = kubernetes.client.CoreV1Api(controlplane.api_client(operator_kubeconfig))
    core.read_namespace(namespace)
    listed = core.list_namespace(label_selector=f"{LABEL}=true").items
    assert all(item.metadata.labels.get(LABEL) == "true" for item in listed)
    patches: list[dict[str, Any]] = [
        {"metadata": {"labels": {LABEL: "true"}}},
        {"metadata": {"annotations": {"x": "y"}}},
    ]
    for patch in patches:
        with pytest.raises(kubernetes.client.ApiException) as refused:
            core.patch_namespace(namespace, patch)
        assert refused.value.status == 403
    with pytest.raises(kubernetes.client.ApiException) as refused:
        core.delete_namespace(namespace)
    assert refused.value.status == 403


def test_an_operator_watching_named_namespaces_follows_their_labels_alone(
    api: kubernetes.client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """With `--namespace` (the chart's watchNamespaces) kopf watches CronJobs per
    namespace, and namespaces, cluster-scoped, still through the one label-selected watch:
    a labelled namespace it does not watch changes nothing."""
    other = f"{namespace[:50]}-x"
    kubernetes.client.CoreV1Api(api).create_namespace({"metadata": {"name": other}})
    try:
        operator.args = ["--namespace", namespace]
        operator.restart()
        create(api, namespace, "plain")
        create(api, other, "plain")
        label(api, namespace, "true")
        label(api, other, "true")
        wait_injected(api, namespace, "plain")
        create(api, namespace, "own", **{LABEL: "true"})
        wait_injected(api, namespace, "own")  # by now the other namespace was seen too
        assert not has_sidecar(read(api, other, "plain"))
    finally:
        operator.args = []
        operator.restart()
        kubernetes.client.CoreV1Api(api).delete_namespace(other)


PROBED = [
    {
        "name": "work",
        "image": "busybox:1.36",
        "command": ["sh", "-c", "sleep 5"],
        "livenessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 10},
    }
]


def pod_with_token(
    api: kubernetes.client.ApiClient,
    controlplane: ControlPlane,
    namespace: str,
    account: str,
    directory: Path,
    *,
    name: str | None = None,
    job: str | None = None,
) -> tuple[str, kubernetes.client.CoordinationV1Api]:
    """A pod's holder identity and the Lease API as its pod-bound token (the kubelet's kind)
    sees it: a never-started pod `name` on `account`, or the pod the Job controller made for
    `job`."""
    if job is not None:
        pod = pod_of(api, namespace, job)
    else:
        # `default` too may not exist yet in a new namespace (its controller makes it).
        wait_for(lambda: _account(api, namespace, account), 30, f"ServiceAccount {account}")
        pod = kubernetes.client.CoreV1Api(api).create_namespaced_pod(
            namespace, gen.pod(name, account)
        )
    path = make_service_account_kubeconfig(
        controlplane,
        api,
        namespace,
        account,
        directory,
        bound_pod=(pod.metadata.name, pod.metadata.uid),
    )
    identity = contract.holder_identity(pod.metadata.name, pod.metadata.uid)
    return identity, kubernetes.client.CoordinationV1Api(controlplane.api_client(path))


def test_the_label_hands_no_lock_to_default_and_imposes_no_signal(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    tmp_path: Path,
) -> None:
    """The review's N4 steps: a labelled namespace, an unannotated CronJob `backup` whose
    pods run as `default`, and a web app's pod on `default` with its pod-bound token. No
    Role grants `default` the backup's Lease, there is none, and a Warning says how to
    guard it. An unannotated CronJob with its own livenessProbe gets no
    shareProcessNamespace. On the same set-up a CronJob on an account of its own is
    guarded, and one annotated on `default` is too (its author's choice)."""
    label(api, namespace, "true")
    created = create(api, namespace, "backup", account=None)
    probed_version = create(api, namespace, "probed", containers=PROBED)
    create(api, namespace, "nightly")
    create(api, namespace, "asked", account=None, **{LABEL: "true"})
    wait_injected(api, namespace, "nightly", "asked")

    [declined] = wait_event(api, namespace, "backup", "NotGuarded")
    assert "'default'" in declined
    assert "give it a ServiceAccount of its own" in declined
    assert 'annotate it cronlock.io/enabled: "true"' in declined
    [imposed] = wait_event(api, namespace, "probed", "NotGuarded")
    assert "work have their own livenessProbe" in imposed
    assert "resolve to signal" in imposed
    types = {kind for kind, reason, _ in events(api, namespace, "backup") if reason == "NotGuarded"}
    assert types == {"Warning"}
    # Neither was written at all: no injection, no shareProcessNamespace.
    assert read(api, namespace, "backup")["metadata"]["resourceVersion"] == created
    probed = read(api, namespace, "probed")
    assert probed["metadata"]["resourceVersion"] == probed_version
    assert "shareProcessNamespace" not in probed["spec"]["jobTemplate"]["spec"]["template"]["spec"]

    leases = kubernetes.client.CoordinationV1Api(api).list_namespaced_lease(namespace).items
    assert {lease.metadata.name for lease in leases} == {"cronlock-nightly", "cronlock-asked"}
    roles = kubernetes.client.RbacAuthorizationV1Api(api).list_namespaced_role(namespace).items
    granted = {role.metadata.name: role.rules[0].resource_names for role in roles}
    assert granted == {
        "cronlock-holder-default": ["cronlock-asked"],
        "cronlock-holder-runs": ["cronlock-nightly"],
    }

    # The attacker: a web app's pod on `default`, with the token the kubelet would mount.
    web, as_web = pod_with_token(api, controlplane, namespace, "default", tmp_path, name="web-7f9c")
    with pytest.raises(kubernetes.client.ApiException) as refused:
        claim_free_lease(as_web, namespace, "cronlock-backup", web)
    assert refused.value.status == 403, refused.value.body
    # The same token may claim the Lease its account is granted (the annotated CronJob's):
    # the 403 above is the grant withheld, not a token that works nowhere. That hold, by
    # a pod that is no run, is broken too.
    claim_free_lease(as_web, namespace, "cronlock-asked", web)
    [broken] = wait_event(api, namespace, "asked", "ForeignHolder")
    assert web in broken


def test_a_hold_by_a_pod_that_is_no_run_is_broken_and_a_runs_hold_is_kept(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    tmp_path: Path,
) -> None:
    """A CronJob on an account of its own (`runs`), guarded by the label. A bare pod on
    `runs` claims the free Lease in its own name, as RBAC and the holders' policy let it:
    the operator clears it well within one renew period (20s at the ttl of 60s) and says
    who. `cronlock-sidecar run` outside Kubernetes holds it and runs its work; then a run
    made as `kubectl create job --from=cronjob/report` makes it claims and renews: both
    holds are kept."""
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "runs"}})
    label(api, namespace, "true")
    create(api, namespace, "report")
    wait_injected(api, namespace, "report")
    leases = kubernetes.client.CoordinationV1Api(api)

    def holder() -> str:
        return str(
            leases.read_namespaced_lease("cronlock-report", namespace).spec.holder_identity or ""
        )

    intruder, as_intruder = pod_with_token(
        api, controlplane, namespace, "runs", tmp_path, name="intruder"
    )
    wait_for(
        lambda: _can_get(as_intruder, namespace, "cronlock-report"), 30, "the holder Role of runs"
    )
    claim_free_lease(as_intruder, namespace, "cronlock-report", intruder)
    claimed = time.monotonic()
    wait_for(lambda: holder() == "", 20, "the operator to break the intruder's hold")
    assert time.monotonic() - claimed < 20, "within one renew period"
    [message] = wait_event(api, namespace, "report", "ForeignHolder")
    assert intruder in message
    assert "owned by no Job" in message
    assert "ServiceAccount runs" in message

    # `cronlock-sidecar run` outside Kubernetes (here with the admin's credentials, which no
    # holders' policy judges): its identity names no pod, and its hold is left alone.
    ran = tmp_path / "ran"
    outside = subprocess.Popen(
        [
            *(str(BIN / "cronlock-sidecar"), "run", "--lease", f"{namespace}/cronlock-report"),
            *("--", "sh", "-c", f"sleep 4; touch {ran}"),
        ],
        env=controlplane.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    held = wait_for(holder, 15, "the hold of cronlock-sidecar run")
    holds(lambda: holder() == held, 3, "the hold of cronlock-sidecar run")
    _, stderr = outside.communicate(timeout=30)
    assert outside.returncode == 0, stderr
    assert ran.exists()
    wait_for(lambda: holder() == "", 10, "its release")

    # A run, as kubectl create job --from=cronjob/report makes it: owned by the CronJob.
    job_from(api, namespace, "report", "report-manual")
    run, as_run = pod_with_token(
        api, controlplane, namespace, "runs", tmp_path, job="report-manual"
    )
    claim_free_lease(as_run, namespace, "cronlock-report", run, job="report-manual")
    holds(lambda: holder() == run, 4, "the run's hold")
    now = format_microtime(datetime.datetime.now(datetime.UTC))
    as_run.patch_namespaced_lease("cronlock-report", namespace, {"spec": {"renewTime": now}})
    holds(lambda: holder() == run, 4, "the run's renewed hold")
    assert len(wait_event(api, namespace, "report", "ForeignHolder")) == 1
    assert holder() == run


def _can_get(leases: kubernetes.client.CoordinationV1Api, namespace: str, name: str) -> bool:
    try:
        leases.read_namespaced_lease(name, namespace)
    except kubernetes.client.ApiException as error:
        if error.status == 403:
            return False
        raise
    return True


def _account(api: kubernetes.client.ApiClient, namespace: str, name: str) -> bool:
    try:
        kubernetes.client.CoreV1Api(api).read_namespaced_service_account(name, namespace)
    except kubernetes.client.ApiException as error:
        if error.status == 404:
            return False
        raise
    return True
