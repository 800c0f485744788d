"""The holders' admission policy, from the side of a pod on a shared ServiceAccount.

Every pod here authenticates with a token bound to it, as the kubelet's projected tokens
are, on the account `shared` that the guarded CronJob `report` runs as. RBAC lets all of
them update `cronlock-report`; the chart's policy lets each write it only as itself.
"""

from __future__ import annotations

import datetime
import re
import ssl
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from cronlock_sidecar import contract
from cronlock_sidecar.holding.lease import Acquired, LeaseKeeper, SystemClock
from cronlock_sidecar.lock import ticks
from cronlock_sidecar.lock.model import Timing, claimed, noted, released, renewed
from cronlock_sidecar.microtime import format_microtime
from cronlock_sidecar.transport.kubeapi import KubeLeaseClient
from cronlock_sidecar.transport.kubeconfig import from_kubeconfig
from cronlock_sidecar.transport.seam import LeaseRef
from tests.support import gen
from tests.support.controlplane import ControlPlane, make_service_account_kubeconfig
from tests.support.kube import wait_for
from tests.support.objects import read, wait_event
from tests.support.run_pods import job_from, pod_of

pytestmark = pytest.mark.usefixtures("operator")

LEASE = "cronlock-report"
RUN_JOB = "report-29000000"


class Pod:
    """A pod on the shared account, and the Lease API as its token sees it."""

    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        name: str,
        leases: Any,
        uid: str,
        kubeconfig: Path | None = None,
    ):
        self.name = name
        self.uid = uid
        self.kubeconfig = kubeconfig  # the pod-bound token's, for the sidecar's own client
        # Built by the sidecar's own function: the policy must accept exactly its identities.
        self.identity = contract.holder_identity(name, uid)
        self.leases = leases
        self._api = api

    def write(self, namespace: str, change: Callable[[dict[str, Any]], None]) -> None:
        """Read the Lease, change it, write it back (raises the API's refusal)."""
        lease = self._api.sanitize_for_serialization(
            self.leases.read_namespaced_lease(LEASE, namespace)
        )
        change(lease)
        self.leases.replace_namespaced_lease(LEASE, namespace, lease)


# A run's pod, by this module's names: <Job>-<5 characters>, the Job one of `report`'s.
_RUN_POD = re.compile(r"(report-[0-9]+)-[a-z]{5}")
# Per namespace: the run pods already handed out.
_TAKEN: dict[str, set[str]] = {}


def make_pod(
    api: kubernetes.client.ApiClient,
    controlplane: ControlPlane,
    namespace: str,
    name: str,
    directory: Path,
) -> Pod:
    """A never-started pod on `shared` and its pod-bound token. A name shaped as a run's
    pod (`report-29000000-abcde`) gives a run's pod: one the Job controller made for the
    Job `report-29000000`, owned by the CronJob `report` as `kubectl create job --from`
    makes it (the operator breaks a hold by any other pod: reconcile/holders.py); its name
    is the Job's and 5 random characters. Any other name gives a bare pod of that name."""
    core = kubernetes.client.CoreV1Api(api)
    run = _RUN_POD.fullmatch(name)
    if run is not None:
        job_from(api, namespace, "report", run.group(1), pods=3)
        created = pod_of(api, namespace, run.group(1), _TAKEN.setdefault(namespace, set()))
    else:
        created = core.create_namespaced_pod(namespace, gen.pod(name, "shared"))
    name, uid = created.metadata.name, created.metadata.uid
    path = make_service_account_kubeconfig(
        controlplane, api, namespace, "shared", directory, bound_pod=(name, uid)
    )
    leases = kubernetes.client.CoordinationV1Api(controlplane.api_client(path))
    return Pod(api, name, leases, uid, path)


def refused(pod: Pod, namespace: str, change: Callable[[dict[str, Any]], None]) -> str:
    with pytest.raises(kubernetes.client.ApiException) as denied:
        pod.write(namespace, change)
    assert denied.value.status == 403, denied.value.body
    body = str(denied.value.body)
    assert "cronlock holder policy:" in body, body
    return body


def hold(identity: str, *, duration: int = 60, job: str = "") -> Callable[[dict[str, Any]], None]:
    def change(lease: dict[str, Any]) -> None:
        stamp = format_microtime(datetime.datetime.now(datetime.UTC))
        lease["spec"].update(
            holderIdentity=identity,
            acquireTime=stamp,
            renewTime=stamp,
            leaseDurationSeconds=duration,
            leaseTransitions=lease["spec"].get("leaseTransitions", 0) + 1,
        )
        annotations = lease["metadata"].setdefault("annotations", {})
        if job:
            annotations["cronlock.io/holder-job"] = job

    return change


def renew(lease: dict[str, Any]) -> None:
    lease["spec"]["renewTime"] = format_microtime(datetime.datetime.now(datetime.UTC))


def clear(lease: dict[str, Any]) -> None:
    lease["spec"].pop("holderIdentity", None)


def guarded_on_shared(
    api: kubernetes.client.ApiClient, namespace: str, annotations: dict[str, str] | None = None
) -> None:
    """The CronJob `report` on the account `shared`, injected (its Lease made first)."""
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "shared"}})
    cronjob = gen.cronjob(
        "report", *gen.BY_HAND, gen.annotated(annotations or {}), gen.service_account("shared")
    )
    kubernetes.client.BatchV1Api(api).create_namespaced_cron_job(namespace, cronjob)
    wait_for(
        lambda: any(
            container["name"] == "cronlock"
            for container in read(api, namespace, "report")["spec"]["jobTemplate"]["spec"][
                "template"
            ]["spec"].get("initContainers")
            or []
        ),
        30,
        "the CronJob to be injected",
    )


def test_a_pod_on_the_shared_account_writes_the_lease_only_as_itself(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    tmp_path: Path,
) -> None:
    guarded_on_shared(api, namespace)
    run = make_pod(api, controlplane, namespace, f"{RUN_JOB}-abcde", tmp_path)
    intruder = make_pod(api, controlplane, namespace, "intruder", tmp_path)
    retry = make_pod(api, controlplane, namespace, f"{RUN_JOB}-fghij", tmp_path)
    wait_for(lambda: _can_read(intruder, namespace), 30, "the holder Role for `shared`")

    # While the Lease is free: nobody may claim it in another pod's name. (The first
    # refusal is waited for: the API server enforces a new policy a moment after it exists.)
    leases = kubernetes.client.CoordinationV1Api(api)
    wait_for(
        lambda: _refused_now(intruder, namespace, hold(run.identity), leases),
        30,
        "the holders' policy to be enforced",
    )
    message = refused(intruder, namespace, hold(run.identity))
    assert f"pod intruder may hold this Lease only as {intruder.identity}" in message

    # The run's pod claims it as itself.
    run.write(namespace, hold(run.identity, job=RUN_JOB))

    # The intruder can neither take it over, renew it, clear it, nor change its labels
    # or owners.
    assert "the Lease is held by " + run.identity in refused(
        intruder, namespace, hold(intruder.identity)
    )
    refused(intruder, namespace, renew)
    refused(intruder, namespace, clear)

    def unlabel(lease: dict[str, Any]) -> None:
        lease["metadata"]["labels"].pop("app.kubernetes.io/managed-by")

    def disown(lease: dict[str, Any]) -> None:
        lease["metadata"]["ownerReferences"] = []

    assert "never changes a Lease's labels, owners or finalizers" in refused(
        intruder, namespace, unlabel
    )
    refused(run, namespace, disown)
    assert leases.read_namespaced_lease(LEASE, namespace).spec.holder_identity == run.identity

    # A contender may add exactly its notes, each naming itself (replace: yield-to,
    # observe: overlap), and nothing else with them.
    def noting(key: str, value: str) -> Callable[[dict[str, Any]], None]:
        def change(lease: dict[str, Any]) -> None:
            lease["metadata"].setdefault("annotations", {})[key] = value

        return change

    def note_and_renew(lease: dict[str, Any]) -> None:
        noting("cronlock.io/yield-to", intruder.identity)(lease)
        renew(lease)

    def drop_job(lease: dict[str, Any]) -> None:
        lease["metadata"]["annotations"].pop("cronlock.io/holder-job")

    intruder.write(namespace, noting("cronlock.io/yield-to", intruder.identity))
    intruder.write(namespace, noting("cronlock.io/overlap", intruder.identity))
    refused(intruder, namespace, noting("cronlock.io/yield-to", retry.identity))
    refused(intruder, namespace, noting("cronlock.io/replaced-jobs", RUN_JOB))
    refused(intruder, namespace, note_and_renew)
    refused(intruder, namespace, drop_job)
    noted = leases.read_namespaced_lease(LEASE, namespace)
    assert noted.spec.holder_identity == run.identity
    assert noted.metadata.annotations["cronlock.io/yield-to"] == intruder.identity
    assert noted.metadata.annotations["cronlock.io/overlap"] == intruder.identity
    # Another contender overwrites a note with its own name (the newest replace run wins).
    retry.write(namespace, noting("cronlock.io/yield-to", retry.identity))

    # Its holder renews it; the Job's next pod (its retry) may take it over at once.
    run.write(namespace, renew)
    retry.write(namespace, hold(retry.identity, duration=5, job=RUN_JOB))

    # A hold whose renewals stopped is cleared by the operator (duration 5s + skew), and
    # then the Lease is free for whoever claims it first.
    wait_for(
        lambda: not leases.read_namespaced_lease(LEASE, namespace).spec.holder_identity,
        30,
        "the operator to clear the hold that stopped renewing",
    )
    run.write(namespace, hold(run.identity, job=RUN_JOB))
    run.write(namespace, clear)
    assert not leases.read_namespaced_lease(LEASE, namespace).spec.holder_identity


def _can_read(pod: Pod, namespace: str) -> bool:
    try:
        pod.leases.read_namespaced_lease(LEASE, namespace)
    except kubernetes.client.ApiException as error:
        if error.status in (403, 404):
            return False
        raise
    return True


def _refused_now(
    pod: Pod, namespace: str, change: Callable[[dict[str, Any]], None], admin: Any
) -> bool:
    try:
        pod.write(namespace, change)
    except kubernetes.client.ApiException as error:
        return error.status == 403 and "cronlock holder policy:" in str(error.body)
    # Not yet enforced: the cluster admin undoes what got through, and we look again.
    admin.patch_namespaced_lease(
        LEASE,
        namespace,
        [{"op": "remove", "path": "/spec/holderIdentity"}],
        _content_type="application/json-patch+json",
    )
    return False


def test_a_token_bound_to_no_pod_writes_nothing_and_nobody_holds_a_lock_for_68_years(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    tmp_path: Path,
) -> None:
    """Security review N4 and N3/N10: a token minted for the account (`kubectl create
    token`, which the built-in `edit` role may do) or impersonation of it writes nothing;
    a pod cannot choose a hold longer than any lock's ttl, nor add a finalizer."""
    guarded_on_shared(api, namespace)
    run = make_pod(api, controlplane, namespace, f"{RUN_JOB}-abcde", tmp_path)
    wait_for(lambda: _can_read(run, namespace), 30, "the holder Role for `shared`")
    admin = kubernetes.client.CoordinationV1Api(api)
    wait_for(
        lambda: _refused_now(run, namespace, hold(run.identity, duration=2147483647), admin),
        30,
        "the holders' policy to be enforced",
    )
    message = refused(run, namespace, hold(run.identity, duration=2147483647))
    assert "leaseDurationSeconds must be from 1 to 86400" in message

    minted_path = make_service_account_kubeconfig(controlplane, api, namespace, "shared", tmp_path)
    minted = Pod(
        api,
        "minted",
        kubernetes.client.CoordinationV1Api(controlplane.api_client(minted_path)),
        "00000000",
    )
    impersonating = kubernetes.client.ApiClient(api.configuration)
    impersonating.default_headers["Impersonate-User"] = f"system:serviceaccount:{namespace}:shared"
    as_account = Pod(api, "as", kubernetes.client.CoordinationV1Api(impersonating), "00000000")

    def unlabel(lease: dict[str, Any]) -> None:
        lease["metadata"]["labels"].pop("app.kubernetes.io/managed-by")

    def disown(lease: dict[str, Any]) -> None:
        lease["metadata"]["ownerReferences"] = []

    for writer in (minted, as_account):
        for change in (hold(writer.identity), unlabel, disown):
            assert "token bound to no pod" in refused(writer, namespace, change)

    run.write(namespace, hold(run.identity, job=RUN_JOB))
    for writer in (minted, as_account):
        for change in (clear, hold("mallory"), unlabel, disown):
            refused(writer, namespace, change)
    intruder = make_pod(api, controlplane, namespace, "intruder", tmp_path)

    def stick(lease: dict[str, Any]) -> None:
        lease["metadata"]["finalizers"] = ["example.com/stuck"]

    assert "finalizers" in refused(intruder, namespace, stick)
    refused(run, namespace, stick)
    lease = admin.read_namespaced_lease(LEASE, namespace)
    assert lease.spec.holder_identity == run.identity
    assert lease.metadata.owner_references
    assert not lease.metadata.finalizers
    impersonating.close()


def test_a_hold_written_for_a_day_is_cleared_after_the_locks_ttl(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    tmp_path: Path,
) -> None:
    """Security review N3: the longest hold admission lets a pod write (a day) is believed
    by the operator only for its lock's ttl (19s here) plus the skew once it stops."""
    guarded_on_shared(api, namespace, {"cronlock.io/ttl": "19s"})
    # A run's pod: any other pod's hold is broken at once (reconcile/holders.py).
    squatter = make_pod(api, controlplane, namespace, f"{RUN_JOB}-abcde", tmp_path)
    wait_for(lambda: _can_read(squatter, namespace), 30, "the holder Role for `shared`")
    leases = kubernetes.client.CoordinationV1Api(api)
    squatter.write(namespace, hold(squatter.identity, duration=86400))
    claimed = datetime.datetime.now(datetime.UTC)
    wait_for(
        lambda: not leases.read_namespaced_lease(LEASE, namespace).spec.holder_identity,
        60,
        "the operator to clear the day-long hold after the lock's ttl",
    )
    waited = (datetime.datetime.now(datetime.UTC) - claimed).total_seconds()
    assert 19 <= waited <= 40, waited

    def expired_events() -> list[str]:
        events = kubernetes.client.CoreV1Api(api).list_namespaced_event(
            namespace, field_selector="reason=LeaseExpired"
        )
        return [event.involved_object.name for event in events.items]

    # The operator posts the Event after it has cleared the Lease (reconcile/expiry.py):
    # give it the moment between the two writes.
    wait_for(lambda: expired_events() != [], 10, "the LeaseExpired Event")
    assert expired_events() == ["report"]


def test_every_field_of_a_lease_has_a_writer_and_one_write_bricks_no_lock(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    tmp_path: Path,
) -> None:
    """Security review M2: a pod on the account (here `x3`, no run's pod) cannot set
    leaseTransitions to int32's end (every later claim a 400), list future Jobs in
    replaced-jobs (each would skip) or choose the next fencing token; a run's own claim,
    renew, note and release, written by the sidecar's own functions, still go through."""
    guarded_on_shared(api, namespace)
    run = make_pod(api, controlplane, namespace, f"{RUN_JOB}-abcde", tmp_path)
    x3 = make_pod(api, controlplane, namespace, "x3", tmp_path)
    nxt = make_pod(api, controlplane, namespace, "report-29000001-fghij", tmp_path)
    wait_for(lambda: _can_read(x3, namespace), 30, "the holder Role for `shared`")
    admin = kubernetes.client.CoordinationV1Api(api)
    timing = Timing.of(60)

    def spec(**fields: Any) -> Callable[[dict[str, Any]], None]:
        def change(lease: dict[str, Any]) -> None:
            lease["spec"].update(fields)

        return change

    def note(**annotations: str) -> Callable[[dict[str, Any]], None]:
        def change(lease: dict[str, Any]) -> None:
            lease["metadata"].setdefault("annotations", {}).update(annotations)

        return change

    wait_for(
        lambda: _refused_now(x3, namespace, spec(leaseTransitions=2147483647), admin),
        30,
        "the holders' policy to be enforced",
    )
    # The free Lease: no field but a claim's.
    future = ",".join(f"report-{29000100 + index}" for index in range(100))
    assert "leaseTransitions is 0; only a claim may change it, to 1" in refused(
        x3, namespace, spec(leaseTransitions=2147483647)
    )
    assert "this write changes cronlock.io/replaced-jobs" in refused(
        x3, namespace, note(**{"cronlock.io/replaced-jobs": future})
    )
    refused(
        x3,
        namespace,
        note(**{"cronlock.io/replaced-jobs": future, "cronlock.io/replaced-by": x3.identity}),
    )
    refused(x3, namespace, note(**{"cronlock.io/last-holder": "\x1b]0;owned\x07"}))
    refused(x3, namespace, note(**{"example.com/anything": "x"}))
    assert "the spec of a Lease it does not hold" in refused(
        x3, namespace, spec(leaseDurationSeconds=5)
    )

    def wrote(
        change: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> Callable[[dict[str, Any]], None]:
        def apply(lease: dict[str, Any]) -> None:
            new = change(lease)
            lease.clear()
            lease.update(new)

        return apply

    def now() -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC)

    # A claim: one more transition, exactly; its holder-job names its own Job only.
    def claim_by(pod: Pod, job: str, **extra: Any) -> Callable[[dict[str, Any]], None]:
        def change(lease: dict[str, Any]) -> dict[str, Any]:
            body = claimed(lease, pod.identity, timing, now(), job)
            body["spec"].update(extra.get("spec", {}))
            body["metadata"]["annotations"].update(extra.get("notes", {}))
            return body

        return wrote(change)

    assert "a claim sets it to 1" in refused(
        run, namespace, claim_by(run, RUN_JOB, spec={"leaseTransitions": 1000})
    )
    # L-M2 (a): a claim that keeps the transitions would hand its work the last token.
    assert "leaseTransitions is 0; a claim sets it to 1" in refused(
        run, namespace, claim_by(run, RUN_JOB, spec={"leaseTransitions": 0})
    )
    refused(run, namespace, claim_by(run, "report-29000001"))
    refused(run, namespace, claim_by(run, RUN_JOB, notes={"cronlock.io/replaced-jobs": future}))
    run.write(namespace, claim_by(run, RUN_JOB))
    assert admin.read_namespaced_lease(LEASE, namespace).spec.lease_transitions == 1

    # Renewals change times only.
    refused(run, namespace, lambda lease: lease["spec"].update(leaseTransitions=2))
    refused(run, namespace, note(**{"cronlock.io/last-holder": run.identity}))
    run.write(namespace, wrote(lambda lease: renewed(lease, timing, now())))

    # A contender's note; then the holder yields to it: replaced-by the run that asked,
    # replaced-jobs its own Job first, at most 10.
    nxt.write(namespace, wrote(lambda lease: noted(lease, "cronlock.io/yield-to", nxt.identity)))

    def release(**extra: str) -> Callable[[dict[str, Any]], None]:
        def change(lease: dict[str, Any]) -> dict[str, Any]:
            body = released(lease, run.identity, now(), replaced_by=nxt.identity, job_name=RUN_JOB)
            body["metadata"]["annotations"].update(extra)
            return body

        return wrote(change)

    refused(run, namespace, release(**{"cronlock.io/replaced-by": x3.identity}))
    refused(run, namespace, release(**{"cronlock.io/replaced-jobs": f"{RUN_JOB},{future}"}))
    refused(run, namespace, release(**{"cronlock.io/last-holder": nxt.identity}))
    run.write(namespace, release())
    notes = admin.read_namespaced_lease(LEASE, namespace).metadata.annotations
    assert notes["cronlock.io/replaced-jobs"] == RUN_JOB
    assert notes["cronlock.io/replaced-by"] == nxt.identity

    # The next run claims (transitions 2). Its Job's retry pod takes the hold over: a
    # claim too, so one more transition, never the same token as the pod it follows.
    nxt.write(namespace, claim_by(nxt, "report-29000001"))
    retry = make_pod(api, controlplane, namespace, "report-29000001-vwxyz", tmp_path)
    assert "leaseTransitions is 2; a claim sets it to 3" in refused(
        retry, namespace, claim_by(retry, "report-29000001", spec={"leaseTransitions": 2})
    )
    retry.write(namespace, claim_by(retry, "report-29000001"))
    assert admin.read_namespaced_lease(LEASE, namespace).spec.holder_identity == retry.identity
    retry.write(namespace, wrote(lambda lease: released(lease, retry.identity, now())))
    lease = admin.read_namespaced_lease(LEASE, namespace)
    assert lease.spec.lease_transitions == 3
    assert not lease.spec.holder_identity


def test_the_operator_puts_a_bricked_lease_back_in_range_and_says_so(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    tmp_path: Path,
) -> None:
    """A Lease poisoned before the policy (here: by an admin, whom no policy judges) is put
    back by the operator with a LeaseRepaired Warning, and the next claim works."""
    guarded_on_shared(api, namespace)
    run = make_pod(api, controlplane, namespace, f"{RUN_JOB}-abcde", tmp_path)
    wait_for(lambda: _can_read(run, namespace), 30, "the holder Role for `shared`")
    admin = kubernetes.client.CoordinationV1Api(api)
    future = ",".join(f"report-{29000100 + index}" for index in range(50))
    admin.patch_namespaced_lease(
        LEASE,
        namespace,
        {
            "spec": {"leaseTransitions": 2147483647},
            "metadata": {"annotations": {"cronlock.io/replaced-jobs": future}},
        },
    )

    def repaired() -> bool:
        lease = admin.read_namespaced_lease(LEASE, namespace)
        notes = lease.metadata.annotations or {}
        return lease.spec.lease_transitions == 0 and "cronlock.io/replaced-jobs" not in notes

    wait_for(repaired, 30, "the operator to repair the Lease")
    message = wait_event(api, namespace, "report", "LeaseRepaired")
    assert any("leaseTransitions 2147483647" in text for text in message), message
    run.write(namespace, hold(run.identity, job=RUN_JOB))
    assert admin.read_namespaced_lease(LEASE, namespace).spec.lease_transitions == 1


GARBAGE_COLLECTOR = "system:serviceaccount:kube-system:generic-garbage-collector"


def collector_knows(controlplane: ControlPlane, owner: str, dependent: str) -> None:
    """Wait until the garbage collector's graph holds `dependent` as a dependent of `owner`
    (uids), as kube-controller-manager's debug handler shows it to an admin
    (/debug/controllers/garbage-collector-controller/graph). Before that, an orphaning
    delete of the owner finds no dependent to orphan, and the collector later deletes the
    Lease as the dependent of a deleted owner: seen twice in full runs, the last time after
    the collector's first sync (so waiting for that was not enough). A user's own cluster
    (no env_dir) is not reached here."""
    if controlplane.env_dir is None:
        return
    port = _controller_manager_port(controlplane.env_dir)
    pki = controlplane.env_dir / "pki"
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # its serving certificate is self-signed
    context.load_cert_chain(pki / "admin.crt", pki / "admin.key")
    url = (
        f"https://127.0.0.1:{port}/debug/controllers/garbage-collector-controller/graph?uid={owner}"
    )

    def graph_has_it() -> bool:
        with urllib.request.urlopen(url, context=context, timeout=10) as answer:
            return dependent in answer.read().decode()

    wait_for(graph_has_it, 60, f"the garbage collector's graph to hold {dependent}")


def _controller_manager_port(env_dir: Path) -> int:
    """The secure port of the kube-controller-manager started in `env_dir`."""
    kubeconfig = f"--kubeconfig={env_dir / 'controller-manager.kubeconfig'}"
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue  # gone meanwhile
        if kubeconfig in args:
            ports = [arg.split("=", 1)[1] for arg in args if arg.startswith("--secure-port=")]
            return int(ports[0])
    raise LookupError(f"no kube-controller-manager of {env_dir} running")


def test_an_orphaning_delete_of_a_guarded_cronjob_completes_and_the_collector_does_no_more(
    api: kubernetes.client.ApiClient, namespace: str, controlplane: ControlPlane
) -> None:
    """Security review L-N9: the control plane's kube-controller-manager runs with
    --use-service-account-credentials, so the garbage collector writes as its own account
    with a token bound to no pod. `kubectl delete cronjob --cascade=orphan` waits for it to
    drop the CronJob from the Lease's owners: that write goes through, and nothing else the
    collector's name could write does."""
    guarded_on_shared(api, namespace)
    admin = kubernetes.client.CoordinationV1Api(api)
    batch = kubernetes.client.BatchV1Api(api)
    uid = batch.read_namespaced_cron_job("report", namespace).metadata.uid
    lease = wait_for(
        lambda: next(
            (
                found
                for found in admin.list_namespaced_lease(namespace).items
                if found.metadata.name == LEASE
                and [owner.uid for owner in found.metadata.owner_references or []] == [uid]
            ),
            None,
        ),
        30,
        "the Lease owned by the CronJob",
    )
    assert lease.metadata.labels["cronlock.io/lock"] == "report"

    # Under the collector's name (an admin impersonating it), no write but dropping owners.
    as_collector = kubernetes.client.ApiClient(api.configuration)
    as_collector.default_headers["Impersonate-User"] = GARBAGE_COLLECTOR
    collector = kubernetes.client.CoordinationV1Api(as_collector)
    try:
        for patch in (
            {"spec": {"holderIdentity": "report-29000000-abcde_12345678"}},
            {"metadata": {"ownerReferences": [], "annotations": {"cronlock.io/last-holder": "x"}}},
            {"metadata": {"ownerReferences": [dict(owner_of(lease), uid="0" * 36)]}},
        ):
            with pytest.raises(kubernetes.client.ApiException) as denied:
                collector.patch_namespaced_lease(
                    LEASE, namespace, patch, _content_type="application/merge-patch+json"
                )
            assert denied.value.status == 403, denied.value.body
            assert "cronlock holder policy:" in str(denied.value.body)
    finally:
        as_collector.close()

    collector_knows(controlplane, uid, lease.metadata.uid)
    batch.delete_namespaced_cron_job("report", namespace, propagation_policy="Orphan")
    wait_for(
        lambda: (
            not any(
                cronjob.metadata.name == "report"
                for cronjob in batch.list_namespaced_cron_job(namespace).items
            )
        ),
        60,
        "the orphaning delete to complete (the garbage collector's write admitted)",
    )
    kept = admin.read_namespaced_lease(LEASE, namespace)
    assert not kept.metadata.owner_references
    assert kept.metadata.labels == lease.metadata.labels
    assert kept.spec == lease.spec


def owner_of(lease: Any) -> dict[str, Any]:
    [owner] = lease.metadata.owner_references
    return {
        "apiVersion": owner.api_version,
        "kind": owner.kind,
        "name": owner.name,
        "uid": owner.uid,
    }


# --- each tick at most once: the tick records (sidecar lock/ticks.py) ------------------
def _job_uid(api: kubernetes.client.ApiClient, namespace: str, pod: Pod) -> str:
    labels = kubernetes.client.CoreV1Api(api).read_namespaced_pod(pod.name, namespace)
    return str(labels.metadata.labels[contract.JOB_UID_LABEL])


def _tick_of(job: str) -> datetime.datetime:
    at = ticks.tick_of_job("report", job)
    assert at is not None
    return at


def claim_tick(
    pod: Pod, job: str, run: str, *, at: datetime.datetime | None = None, holder: str = ""
) -> Callable[[dict[str, Any]], None]:
    """A claim as the sidecar writes it (lock/model.claimed), its record as given."""

    def change(lease: dict[str, Any]) -> None:
        tick = ticks.Tick("report", at or _tick_of(job), job, run)
        record = ticks.record_of(tick, holder or pod.identity, "east")
        now = datetime.datetime.now(datetime.UTC)
        lease.update(claimed(lease, pod.identity, Timing.of(60), now, job, record))

    return change


def set_tick(job: str, run: str, holder: str) -> Callable[[dict[str, Any]], None]:
    def change(lease: dict[str, Any]) -> None:
        record = ticks.record_of(ticks.Tick("report", _tick_of(job), job, run), holder, "")
        annotations = lease["metadata"].setdefault("annotations", {})
        annotations.update(ticks.with_record({}, record))

    return change


def test_a_tick_record_is_written_only_by_its_own_jobs_claim_and_a_future_one_silences_nothing(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    tmp_path: Path,
) -> None:
    """Attacks on cronlock.io/tick.<cronjob> from pods on the runs' account: a record in
    another pod's, Job's or tick's name, a renewal or release that changes or drops one;
    and a pod named as a far-future tick's Job, whose record passes but is ignored."""
    guarded_on_shared(api, namespace)
    run = make_pod(api, controlplane, namespace, f"{RUN_JOB}-abcde", tmp_path)
    intruder = make_pod(api, controlplane, namespace, "intruder", tmp_path)
    wait_for(lambda: _can_read(intruder, namespace), 30, "the holder Role for `shared`")
    admin = kubernetes.client.CoordinationV1Api(api)
    run_uid = _job_uid(api, namespace, run)
    far = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=3650)
    far_job = f"report-{int(far.timestamp()) // 60}"

    # A pod that is no Job's writes no record, not even its own (no Job names it).
    wait_for(
        lambda: _refused_now(intruder, namespace, claim_tick(intruder, far_job, "x"), admin),
        30,
        "the holders' policy to be enforced",
    )
    message = refused(intruder, namespace, claim_tick(intruder, far_job, "x"))
    assert "cronlock.io/tick.report" in message
    # A run's pod claims, but not with a record naming another holder, another Job, or a
    # tick its Job is not named for.
    refused(run, namespace, claim_tick(run, RUN_JOB, run_uid, holder=intruder.identity))
    refused(run, namespace, claim_tick(run, RUN_JOB, run_uid, at=far))

    def other_job(lease: dict[str, Any]) -> None:
        claim_tick(run, RUN_JOB, run_uid)(lease)
        set_tick(far_job, run_uid, run.identity)(lease)

    refused(run, namespace, other_job)
    assert admin.read_namespaced_lease(LEASE, namespace).spec.holder_identity is None

    # The legitimate claim passes, and its record is the sidecar's.
    run.write(namespace, claim_tick(run, RUN_JOB, run_uid))
    written = admin.read_namespaced_lease(LEASE, namespace).metadata.annotations
    record = ticks.read_record(written, "report")
    assert record == ticks.TickRecord(
        "report", _tick_of(RUN_JOB), RUN_JOB, run_uid, run.identity, "east"
    )

    # Its renewals and its release carry the record; none may change or drop it.
    def renew_to_later_tick(lease: dict[str, Any]) -> None:
        renew(lease)
        set_tick(far_job, run_uid, run.identity)(lease)

    def release_dropping(lease: dict[str, Any]) -> None:
        lease.update(released(lease, run.identity, datetime.datetime.now(datetime.UTC)))
        lease["metadata"]["annotations"].pop("cronlock.io/tick.report")

    refused(run, namespace, renew_to_later_tick)
    refused(run, namespace, release_dropping)
    refused(intruder, namespace, set_tick(RUN_JOB, "x", intruder.identity))
    run.write(namespace, lambda lease: lease.update(renewed(lease, Timing.of(60), _now())))
    run.write(namespace, lambda lease: lease.update(released(lease, run.identity, _now())))
    after = admin.read_namespaced_lease(LEASE, namespace).metadata.annotations
    assert ticks.read_record(after, "report") == record
    # A free Lease's record is no more anyone's to change without a claim.
    refused(intruder, namespace, set_tick(RUN_JOB, "x", intruder.identity))

    # A pod that names itself as a far-future tick's Job (it can: it is on the account)
    # writes that tick, and releases.
    hostile = make_pod(api, controlplane, namespace, f"{far_job}-klmno", tmp_path)
    hostile.write(namespace, claim_tick(hostile, far_job, "hostile-run"))
    hostile.write(namespace, lambda lease: lease.update(released(lease, hostile.identity, _now())))
    planted = ticks.read_record(
        admin.read_namespaced_lease(LEASE, namespace).metadata.annotations, "report"
    )
    assert planted is not None
    assert planted.at == far.replace(second=0, microsecond=0)

    # The next real run, the sidecar's own LeaseKeeper on its pod's token, claims all the
    # same: the future record is nobody's tick yet. (Its tick is older than the record,
    # and the policy lets it write so: a "never older" rule would silence the CronJob.)
    next_job = f"report-{int(_now().timestamp()) // 60}"
    nxt = make_pod(api, controlplane, namespace, f"{next_job}-pqrst", tmp_path)
    assert nxt.kubeconfig is not None
    tick = ticks.Tick("report", _tick_of(next_job), next_job, _job_uid(api, namespace, nxt))
    client = KubeLeaseClient(from_kubeconfig([nxt.kubeconfig]))
    try:
        keeper = LeaseKeeper(
            client,
            LeaseRef(namespace, LEASE),
            nxt.identity,
            Timing.of(60),
            SystemClock(),
            next_job,
            tick=tick,
        )
        assert isinstance(keeper.try_acquire(), Acquired)
        assert keeper.release()
    finally:
        client.close()
    final = ticks.read_record(
        admin.read_namespaced_lease(LEASE, namespace).metadata.annotations, "report"
    )
    assert final is not None
    assert (final.job, final.holder) == (next_job, nxt.identity)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
