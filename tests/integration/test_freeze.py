"""`cronlock freeze`: a lock frozen for maintenance on a real API server with the chart's
RBAC and policies; runs skip until it ends, and only a caller allowed to freeze may."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from cronlock_operator.freeze import commands as freezing
from cronlock_sidecar import contract
from cronlock_sidecar.microtime import parse_microtime
from tests.support import gen
from tests.support.controlplane import ControlPlane, make_service_account_kubeconfig
from tests.support.cronjobs import job_from_cronjob
from tests.support.kube import finish_pod, wait_for
from tests.support.objects import events, wait_event
from tests.support.paths import SIDECAR

pytestmark = pytest.mark.usefixtures("operator")

CRONLOCK = Path(sys.executable).with_name("cronlock")
SKIPPED = contract.EXIT_SKIPPED
FREEZER = "cronlock-cronlock-system-freezer"  # the chart's <clusterName>-freezer


def guarded(api: kubernetes.client.ApiClient, namespace: str, name: str) -> None:
    """A guarded CronJob; the operator makes its Lease."""
    kubernetes.client.BatchV1Api(api).create_namespaced_cron_job(
        namespace, gen.cronjob(name, gen.in_namespace(None), gen.never_due())
    )
    leases = kubernetes.client.CoordinationV1Api(api)
    wait_for(lambda: _exists(leases, namespace, contract.lease_name(name)), 30, f"lease of {name}")


def _exists(leases: Any, namespace: str, name: str) -> bool:
    try:
        leases.read_namespaced_lease(name, namespace)
    except kubernetes.client.ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def notes(api: kubernetes.client.ApiClient, namespace: str, lock: str) -> dict[str, str]:
    lease = kubernetes.client.CoordinationV1Api(api).read_namespaced_lease(
        contract.lease_name(lock), namespace
    )
    return {
        key: value
        for key, value in (lease.metadata.annotations or {}).items()
        if key in contract.FREEZE_NOTES
    }


def cli(controlplane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CRONLOCK), *args], env=controlplane.env, capture_output=True, text=True, timeout=60
    )


def run_once(
    controlplane: ControlPlane, namespace: str, lock: str
) -> subprocess.CompletedProcess[str]:
    """`cronlock-sidecar run` on the lock, as a run outside a pod would take it."""
    return subprocess.run(
        [str(SIDECAR), "run", "--lease", f"{namespace}/{contract.lease_name(lock)}", "--", "true"],
        env=controlplane.env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def as_user(
    controlplane: ControlPlane, api: kubernetes.client.ApiClient, user: str
) -> kubernetes.client.ApiClient:
    impersonating = controlplane.api_client()
    impersonating.default_headers["Impersonate-User"] = user
    return impersonating


def bind(
    api: kubernetes.client.ApiClient, namespace: str, user: str, role_kind: str, role: str
) -> None:
    kubernetes.client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": f"{user}-{role}"[:63]},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    )


def test_a_frozen_lock_skips_runs_until_unfrozen_and_says_until_when_by_whom_and_why(
    api: kubernetes.client.ApiClient, controlplane: ControlPlane, namespace: str
) -> None:
    guarded(api, namespace, "billing")
    before = datetime.now(UTC)
    frozen = cli(controlplane, "freeze", "billing", "-n", namespace, "--for", "2h",
                 "--reason", "billing DB   migration")  # fmt: skip
    assert frozen.returncode == 0, frozen.stderr
    found = notes(api, namespace, "billing")
    until = parse_microtime(found["cronlock.io/frozen-until"])
    assert timedelta(hours=2) <= until - before < timedelta(hours=2, seconds=30)
    # The API server's own name for the caller (the admin's client certificate).
    assert found["cronlock.io/frozen-by"] == "cronlock-admin"
    assert found["cronlock.io/frozen-reason"] == "billing DB migration"
    assert frozen.stdout.strip().endswith("by cronlock-admin: billing DB migration")

    skipped = run_once(controlplane, namespace, "billing")
    assert skipped.returncode == SKIPPED, skipped.stderr
    assert "lock frozen: lease" in skipped.stderr
    assert "by cronlock-admin: billing DB migration; skipping this run" in skipped.stderr

    thawed = cli(controlplane, "unfreeze", "billing", "-n", namespace)
    assert thawed.returncode == 0, thawed.stderr
    assert notes(api, namespace, "billing") == {}
    assert run_once(controlplane, namespace, "billing").returncode == 0
    again = cli(controlplane, "unfreeze", "billing", "-n", namespace)
    assert (again.returncode, again.stdout.strip()) == (
        0,
        f"lock billing in {namespace} was not frozen",
    )


def test_a_freeze_ends_by_itself(
    api: kubernetes.client.ApiClient, controlplane: ControlPlane, namespace: str
) -> None:
    guarded(api, namespace, "short")
    assert cli(controlplane, "freeze", "short", "-n", namespace, "--for", "3s",
               "--reason", "x").returncode == 0  # fmt: skip
    until = parse_microtime(notes(api, namespace, "short")["cronlock.io/frozen-until"])
    assert run_once(controlplane, namespace, "short").returncode == SKIPPED
    # Waits for the freeze's own end (the time it wrote), not a guess at it; then a run goes
    # though the annotations are still there: the sidecar reads the end, nobody unfreezes.
    time.sleep(max(0.0, (until - datetime.now(UTC)).total_seconds()) + 0.2)
    assert notes(api, namespace, "short") != {}
    assert run_once(controlplane, namespace, "short").returncode == 0


def test_bad_freezes_are_usage_errors_and_a_lock_without_a_lease_is_named(
    controlplane: ControlPlane, namespace: str
) -> None:
    for args, message in (
        (["--until", "2020-01-01T00:00:00Z", "--reason", "x"], "already past"),
        (["--for=-1h", "--reason", "x"], "is not a duration"),
        (["--for", "800h", "--reason", "x"], "at most 31 days"),
        (["--for", "2h", "--reason", "   "], "say why"),
        (["--until", "tomorrow", "--reason", "x"], "RFC 3339"),
    ):
        done = cli(controlplane, "freeze", "nolease", "-n", namespace, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr, (args, done.stderr)
    missing = cli(
        controlplane, "freeze", "nolease", "-n", namespace, "--for", "1h", "--reason", "x"
    )
    assert missing.returncode == 1
    assert "lock nolease has no Lease" in missing.stderr


def test_only_a_caller_allowed_the_freeze_verb_may_freeze_and_only_under_its_own_name(
    api: kubernetes.client.ApiClient, controlplane: ControlPlane, namespace: str
) -> None:
    guarded(api, namespace, "ledger")
    rbac = kubernetes.client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "lease-editor"},
            "rules": [
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "verbs": ["get", "patch", "update"],
                }
            ],
        },
    )
    bind(api, namespace, "mallory", "Role", "lease-editor")
    mallory = as_user(controlplane, api, "mallory")
    # Patch rights on Leases are not enough: the policy asks for the verb freeze.
    wait_for(lambda: _refused_once(mallory, namespace, "ledger"), 30, "the freeze policy")
    with pytest.raises(freezing.FreezeError) as refused:
        freezing.freeze(mallory, namespace, "ledger", duration="1h", until=None, reason="x")
    assert refused.value.code == contract.EXIT_UNAVAILABLE
    assert "needs the verb freeze" in str(refused.value)
    assert notes(api, namespace, "ledger") == {}

    bind(api, namespace, "alice", "ClusterRole", FREEZER)
    alice = as_user(controlplane, api, "alice")
    done = freezing.freeze(alice, namespace, "ledger", duration="1h", until=None, reason="upgrade")
    assert done.by == "alice"
    assert notes(api, namespace, "ledger")["cronlock.io/frozen-by"] == "alice"
    # Even a freezer cannot record a freeze under someone else's name, nor can mallory
    # end or change it.
    leases = kubernetes.client.CoordinationV1Api(alice)
    with pytest.raises(kubernetes.client.ApiException) as forged:
        leases.patch_namespaced_lease(
            contract.lease_name("ledger"),
            namespace,
            {"metadata": {"annotations": {"cronlock.io/frozen-by": "bob"}}},
        )
    assert forged.value.status == 403
    assert "recorded under its author's own name" in str(forged.value.body)
    with pytest.raises(freezing.FreezeError):
        freezing.unfreeze(mallory, namespace, "ledger")
    assert notes(api, namespace, "ledger")["cronlock.io/frozen-by"] == "alice"
    assert freezing.unfreeze(alice, namespace, "ledger") is True


def test_freeze_takes_the_auth_flags_status_takes_and_acts_as_the_user_they_name(
    api: kubernetes.client.ApiClient, controlplane: ControlPlane, namespace: str
) -> None:
    """`--as`, `--request-timeout` and the rest of kubectl's flags, as on `status`: an
    admin freezes on a freezer's behalf, under the freezer's name."""
    guarded(api, namespace, "ledger")
    bind(api, namespace, "alice", "ClusterRole", FREEZER)
    freeze = ("freeze", "ledger", "-n", namespace, "--for", "1h", "--reason", "upgrade")
    refused = cli(controlplane, *freeze, "--as", "mallory")
    assert refused.returncode == contract.EXIT_UNAVAILABLE, refused.stderr
    assert notes(api, namespace, "ledger") == {}
    done = cli(controlplane, *freeze, "--as", "alice", "--request-timeout", "20s")
    assert done.returncode == 0, done.stderr
    assert "by alice: upgrade" in done.stdout
    assert notes(api, namespace, "ledger")["cronlock.io/frozen-by"] == "alice"
    bad = cli(controlplane, "unfreeze", "ledger", "-n", namespace, "--as-group", "system:masters")
    assert bad.returncode == 2
    assert "--as-group needs --as" in bad.stderr
    thawed = cli(controlplane, "unfreeze", "ledger", "-n", namespace, "--as", "alice")
    assert thawed.returncode == 0, thawed.stderr
    assert "cronlock.io/frozen-by" not in notes(api, namespace, "ledger")


def _refused_once(api: kubernetes.client.ApiClient, namespace: str, lock: str) -> bool:
    """True once the freeze policy refuses this caller (enforced a moment after it exists).
    A freeze that went through before is left on the Lease, and the test fails on it."""
    try:
        freezing.freeze(api, namespace, lock, duration="1h", until=None, reason="probe")
    except freezing.FreezeError as error:
        return "needs the verb freeze" in str(error)
    return False


def test_a_run_skipped_by_a_freeze_is_a_frozen_event_and_no_skip_in_a_row(
    api: kubernetes.client.ApiClient, controlplane: ControlPlane, namespace: str
) -> None:
    """The operator tells a frozen lock's skip from a held one's: a `Frozen` Event naming
    the freeze, and `consecutive-skips` left alone (maintenance is no stuck run)."""
    guarded(api, namespace, "nightly")
    assert cli(controlplane, "freeze", "nightly", "-n", namespace, "--for", "1h",
               "--reason", "quarterly restore test").returncode == 0  # fmt: skip
    batch = kubernetes.client.BatchV1Api(api)
    body = api.sanitize_for_serialization(batch.read_namespaced_cron_job("nightly", namespace))
    batch.create_namespaced_job(namespace, job_from_cronjob(body, "nightly-1"))
    core = kubernetes.client.CoreV1Api(api)
    pod = wait_for(
        lambda: core.list_namespaced_pod(namespace, label_selector="job-name=nightly-1").items,
        30,
        "the Job's pod",
    )[0]
    # The pod ends as the kubelet reports a gate that found the lock frozen (exit 75).
    finish_pod(core, namespace, pod.metadata.name, gate_exit=SKIPPED)
    [message] = wait_event(api, namespace, "nightly", "Frozen")
    assert message == (
        "run nightly-1 skipped: lock nightly frozen until "
        f"{notes(api, namespace, 'nightly')['cronlock.io/frozen-until']} by cronlock-admin: "
        "quarterly restore test"
    )
    annotations = batch.read_namespaced_cron_job("nightly", namespace).metadata.annotations
    assert "cronlock.io/consecutive-skips" not in (annotations or {})
    assert [r for _, r, _ in events(api, namespace, "nightly") if r == "Skipped"] == []


def test_stop_running_stops_the_run_working_on_the_lock_and_it_gives_the_lock_back(
    api: kubernetes.client.ApiClient, controlplane: ControlPlane, namespace: str
) -> None:
    guarded(api, namespace, "etl")
    lease = f"{namespace}/{contract.lease_name('etl')}"
    working = subprocess.Popen(
        [str(SIDECAR), "run", "--lease", lease, "--ttl", "10s", "--", "sleep", "120"],
        env=controlplane.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        holders = kubernetes.client.CoordinationV1Api(api)
        wait_for(
            lambda: (
                holders.read_namespaced_lease(
                    contract.lease_name("etl"), namespace
                ).spec.holder_identity
            ),
            30,
            "the run to hold the lock",
        )
        frozen = cli(controlplane, "freeze", "etl", "-n", namespace, "--for", "1h",
                     "--reason", "restore", "--stop-running")  # fmt: skip
        assert frozen.returncode == 0, frozen.stderr
        assert "stops at its next renewal" in frozen.stdout
        # renew is ttl/3: the run sees the freeze within about 3.3s, and stops.
        _, log = working.communicate(timeout=20)
    finally:
        working.kill()
        working.communicate()
    assert working.returncode == contract.EXIT_SOFTWARE_LOST, log
    assert "with --stop-running; stopping this run" in log
    lease_now = holders.read_namespaced_lease(contract.lease_name("etl"), namespace)
    assert not lease_now.spec.holder_identity, "given back once the work stopped"
    assert run_once(controlplane, namespace, "etl").returncode == SKIPPED


@pytest.mark.parametrize("kind", ["redis", "postgres"])
def test_a_lock_in_a_store_is_frozen_there_and_its_runs_skip_until_unfrozen(
    api: kubernetes.client.ApiClient,
    controlplane: ControlPlane,
    namespace: str,
    request: pytest.FixtureRequest,
    kind: str,
) -> None:
    """`--store-secret`: the freeze is written on the lock's document in Redis or
    PostgreSQL (no Lease), with the caller's name; a run anywhere on that lock skips."""
    server = request.getfixturevalue(f"{kind}_store")
    kubernetes.client.CoreV1Api(api).create_namespaced_secret(
        namespace, {"metadata": {"name": "team-locks"}, "stringData": {"url": server.url}}
    )
    env = {k: v for k, v in controlplane.env.items() if k != "KUBECONFIG"}
    env["CRONLOCK_STORE"] = server.url
    lease = f"{namespace}/{contract.lease_name('ledger')}"

    def run_stored() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SIDECAR), "run", "--lease", lease, "--", "true"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    # A lock never taken in the store is frozen too (its document holds only the freeze).
    frozen = cli(controlplane, "freeze", "ledger", "-n", namespace, "--store-secret",
                 "team-locks", "--for", "10m", "--reason", "restore drill")  # fmt: skip
    assert frozen.returncode == 0, frozen.stderr
    assert frozen.stdout.strip().endswith("by cronlock-admin: restore drill")
    skipped = run_stored()
    assert skipped.returncode == SKIPPED, skipped.stderr
    assert "by cronlock-admin: restore drill; skipping this run" in skipped.stderr
    assert server.password not in frozen.stdout + frozen.stderr + skipped.stderr

    thawed = cli(controlplane, "unfreeze", "ledger", "-n", namespace,
                 "--store-secret", "team-locks")  # fmt: skip
    assert (thawed.returncode, thawed.stdout.strip()) == (0, f"lock ledger in {namespace} unfrozen")
    assert run_stored().returncode == 0
    # Frozen again once the lock has a holder's document; the Lease was never involved.
    assert cli(controlplane, "freeze", "ledger", "-n", namespace, "--store-secret",
               "team-locks", "--for", "1m", "--reason", "again").returncode == 0  # fmt: skip
    assert run_stored().returncode == SKIPPED
    assert not _exists(kubernetes.client.CoordinationV1Api(api), namespace, "cronlock-ledger")
    missing = cli(controlplane, "unfreeze", "ledger", "-n", namespace, "--store-secret", "nope")
    assert missing.returncode == contract.EXIT_UNAVAILABLE
    assert f"there is no Secret {namespace}/nope" in missing.stderr


def test_a_store_locks_registry_lease_is_not_frozen_and_the_cli_names_the_secret(
    api: kubernetes.client.ApiClient, controlplane: ControlPlane, namespace: str
) -> None:
    """Security review L-N5: a lock in Redis keeps a Lease only as its users' registry; its
    runs read freezes from the store. A freeze without --store-secret said "frozen" and
    changed nothing a run reads; now the operator marks the Lease and the CLI refuses,
    naming the Secret, while a Lease lock of the same namespace is still frozen."""
    store = {"cronlock.io/store": "redis", "cronlock.io/store-secret": "team-locks"}
    kubernetes.client.BatchV1Api(api).create_namespaced_cron_job(
        namespace,
        gen.cronjob("nightly", gen.in_namespace(None), gen.never_due(), gen.annotated(store)),
    )
    leases = kubernetes.client.CoordinationV1Api(api)
    wait_for(
        lambda: (
            _exists(leases, namespace, "cronlock-nightly")
            and (leases.read_namespaced_lease("cronlock-nightly", namespace).metadata.annotations)
            == store
        ),
        30,
        "the registry Lease, marked with its store",
    )
    for verb, until in (("freeze", ["--for", "2h", "--reason", "db migration"]), ("unfreeze", [])):
        done = cli(controlplane, verb, "nightly", "-n", namespace, *until)
        assert done.returncode == 2, (verb, done.stdout, done.stderr)
        assert done.stdout == ""
        assert done.stderr.count("\n") == 1, done.stderr
        assert f"lock nightly in {namespace} is kept in redis" in done.stderr
        assert f"{verb} it with --store-secret team-locks" in done.stderr
    assert notes(api, namespace, "nightly") == {}

    guarded(api, namespace, "daily")
    frozen = cli(controlplane, "freeze", "daily", "-n", namespace, "--for", "1h", "--reason", "x")
    assert frozen.returncode == 0, frozen.stderr
    assert contract.ANNOTATION_FROZEN_UNTIL in notes(api, namespace, "daily")


def test_a_freezer_only_freezes_cronlocks_locks_and_writes_nothing_else(
    api: kubernetes.client.ApiClient,
    controlplane: ControlPlane,
    namespace: str,
    tmp_path: Path,
) -> None:
    """Security review M1: the freezer role is `patch` on every Lease of the namespace, so
    the policies must keep its holders (a user, or a CI ServiceAccount with a token bound to
    no pod) to the frozen-* annotations of cronlock's Leases: no live hold taken, no owner,
    label or finalizer changed, no other controller's Lease touched."""
    guarded(api, namespace, "ledger")
    lease_name = contract.lease_name("ledger")
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "ci"}})
    kubernetes.client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "ci-freezer"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": FREEZER,
            },
            "subjects": [{"kind": "ServiceAccount", "name": "ci", "namespace": namespace}],
        },
    )
    bind(api, namespace, "alice2", "ClusterRole", FREEZER)
    ci = controlplane.api_client(
        make_service_account_kubeconfig(controlplane, api, namespace, "ci", tmp_path)
    )
    alice = as_user(controlplane, api, "alice2")
    admin = kubernetes.client.CoordinationV1Api(api)
    admin.create_namespaced_lease(
        namespace,
        {
            "metadata": {"name": "some-controller-leader"},
            "spec": {"holderIdentity": "real-leader", "leaseDurationSeconds": 15},
        },
    )
    # A run holds the lock (written as an admin: no pod is needed to show the freezer's rights).
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    admin.patch_namespaced_lease(
        lease_name,
        namespace,
        {
            "spec": {
                "holderIdentity": "ledger-1-abcde_12345678",
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseDurationSeconds": 60,
            }
        },
    )

    def refused(client: kubernetes.client.ApiClient, name: str, patch: Any, kind: str) -> str:
        with pytest.raises(kubernetes.client.ApiException) as denied:
            kubernetes.client.CoordinationV1Api(client).patch_namespaced_lease(
                name, namespace, patch, **({"_content_type": kind} if kind else {})
            )
        assert denied.value.status == 403, denied.value.body
        return str(denied.value.body)

    take = {"spec": {"holderIdentity": "alice2", "leaseDurationSeconds": 86400}}
    wait_for(lambda: _refused_write(alice, namespace, lease_name, take), 30, "the freezers' policy")
    for client in (alice, ci):
        # A ServiceAccount's token bound to no pod is refused by the holders' policy first.
        said = refused(client, lease_name, take, "")
        assert "may change only the frozen-* annotations" in said or (
            client is ci and "token bound to no pod" in said
        ), said
        refused(
            client,
            lease_name,
            [{"op": "remove", "path": "/metadata/ownerReferences"}],
            "application/json-patch+json",
        )
        refused(client, lease_name, {"metadata": {"finalizers": ["example.com/stuck"]}}, "")
        refused(
            client, lease_name, {"metadata": {"labels": {"app.kubernetes.io/managed-by": None}}}, ""
        )
        refused(
            client, lease_name, {"metadata": {"annotations": {"cronlock.io/yield-to": "x"}}}, ""
        )
        assert "write no other Lease" in refused(
            client, "some-controller-leader", {"spec": {"holderIdentity": "alice2"}}, ""
        )
    lease = admin.read_namespaced_lease(lease_name, namespace)
    assert lease.spec.holder_identity == "ledger-1-abcde_12345678"
    assert lease.metadata.owner_references
    assert not lease.metadata.finalizers
    assert lease.metadata.labels["app.kubernetes.io/managed-by"] == "cronlock"
    other = admin.read_namespaced_lease("some-controller-leader", namespace)
    assert other.spec.holder_identity == "real-leader"

    # What they are for still works, for both: freeze and unfreeze, under their own names.
    for client, name in ((ci, f"system:serviceaccount:{namespace}:ci"), (alice, "alice2")):
        done = freezing.freeze(client, namespace, "ledger", duration="1h", until=None, reason="m")
        assert done.by == name
        assert notes(api, namespace, "ledger")["cronlock.io/frozen-by"] == name
        assert freezing.unfreeze(client, namespace, "ledger") is True
    ci.close()
    alice.close()


def _refused_write(
    client: kubernetes.client.ApiClient, namespace: str, name: str, patch: Any
) -> bool:
    """True once the policy refuses the write (a new policy is enforced a moment after it
    exists); a write that went through before is left on the Lease and the test fails on it."""
    try:
        kubernetes.client.CoordinationV1Api(client).patch_namespaced_lease(
            name, namespace, patch, dry_run="All"
        )
    except kubernetes.client.ApiException as error:
        return error.status == 403
    return False
