"""The operator on a real API server: inject, revert, validate, Leases, RBAC and skips."""

from __future__ import annotations

import copy
import datetime
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from tests.support import gen
from tests.support.contract import EXIT_SKIPPED, GATE_CONTAINER
from tests.support.controlplane import ControlPlane, make_service_account_kubeconfig
from tests.support.cronjobs import job_from_cronjob
from tests.support.kube import finish_pod, holds, wait_for
from tests.support.objects import annotate, batch, comparable, events, read, wait_event
from tests.support.operator import SIDECAR_STORES_IMAGE, OperatorProcess, operator_caught_up

GATE = GATE_CONTAINER


# Created through the API and never due, not yet opted in, with a two-retry Job whose pod
# sleeps 5 s and is not restarted.
UNGUARDED = (
    *gen.BY_HAND,
    gen.not_opted_in(),
    gen.with_job(backoffLimit=2),
    gen.containers({"name": "main", "image": "busybox:1.37", "command": ["sleep", "5"]}),
)

VARIANTS: dict[str, dict[str, Any]] = {
    "on-failure": gen.cronjob("on-failure", *UNGUARDED, gen.restart_policy("OnFailure")),
    "init-and-failure-policy": gen.cronjob(
        "init-and-failure-policy",
        *UNGUARDED,
        gen.with_pod(
            initContainers=[{"name": "prepare", "image": "busybox:1.37", "command": ["true"]}]
        ),
        gen.with_job(
            podFailurePolicy={
                "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
            }
        ),
    ),
    "several-containers": gen.cronjob(
        "several-containers",
        *UNGUARDED,
        gen.labelled({"team": "billing"}),
        gen.with_job_labels({"tier": "batch"}),
        gen.containers(
            {"name": "a", "image": "busybox:1.37", "command": ["true"]},
            {
                "name": "b",
                "image": "busybox:1.37",
                "command": ["true"],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            },
        ),
        gen.with_pod(volumes=[{"name": "scratch", "emptyDir": {}}]),
    ),
    "own-liveness-probe": gen.cronjob(
        "own-liveness-probe",
        *UNGUARDED,
        gen.with_pod(securityContext={"runAsUser": 1000, "runAsNonRoot": True}),
        gen.containers(
            {
                "name": "main",
                "image": "busybox:1.37",
                "command": ["true"],
                "livenessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 5},
            }
        ),
    ),
}


def init_names(cronjob: dict[str, Any]) -> list[str]:
    spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return [container["name"] for container in spec.get("initContainers") or []]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_annotating_injects_and_removing_the_annotation_restores_the_stored_cronjob_exactly(
    api: kubernetes.client.ApiClient, namespace: str, operator: OperatorProcess, variant: str
) -> None:
    manifest = copy.deepcopy(VARIANTS[variant])
    batch(api).create_namespaced_cron_job(namespace, manifest)
    name = manifest["metadata"]["name"]
    before = comparable(read(api, namespace, name))

    annotate(api, namespace, name, enabled="true", ttl="30s")
    injected = wait_for(
        lambda: (
            c if init_names(c := read(api, namespace, name))[:2] == ["cronlock", GATE] else None
        ),
        timeout=30,
        what="the injection",
    )
    pod_spec = injected["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    user_inits = [
        c["name"]
        for c in manifest["spec"]["jobTemplate"]["spec"]["template"]["spec"].get(
            "initContainers", []
        )
    ]
    assert init_names(injected) == ["cronlock", GATE, *user_inits]
    assert pod_spec["restartPolicy"] == "Never"
    rules = injected["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"]
    assert rules[0]["onExitCodes"] == {
        "containerName": GATE,
        "operator": "In",
        "values": [EXIT_SKIPPED],
    }
    user_rules = (
        manifest["spec"]["jobTemplate"]["spec"].get("podFailurePolicy", {}).get("rules", [])
    )
    assert len(rules) == 1 + len(user_rules)
    assert injected["spec"]["jobTemplate"]["metadata"]["labels"]["cronlock.io/lock"] == name
    # Events are posted in the background, a moment after the patch.
    wait_event(api, namespace, name, "Injected")
    # No kopf bookkeeping on the user's object.
    assert not injected["metadata"].get("finalizers")
    assert not [key for key in injected["metadata"].get("annotations", {}) if "kopf" in key]

    # The API server takes a real Job made from the injected template.
    job = batch(api).create_namespaced_job(
        namespace,
        {"metadata": {"name": f"{name}-manual"}, "spec": injected["spec"]["jobTemplate"]["spec"]},
    )
    assert job.metadata.name == f"{name}-manual"

    annotate(api, namespace, name, enabled=None, ttl=None)
    wait_for(
        lambda: init_names(read(api, namespace, name)) == user_inits or None,
        timeout=30,
        what="the revert",
    )
    after = comparable(read(api, namespace, name))
    assert after == before
    wait_event(api, namespace, name, "Reverted")


def test_an_operator_restart_neither_rewrites_nor_double_injects(
    api: kubernetes.client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    manifest = gen.cronjob("steady", *UNGUARDED)
    manifest["metadata"]["annotations"] = {"cronlock.io/enabled": "true"}
    batch(api).create_namespaced_cron_job(namespace, manifest)
    injected = wait_for(
        lambda: c if "cronlock" in init_names(c := read(api, namespace, "steady")) else None,
        timeout=30,
        what="the injection",
    )

    operator.restart()
    operator_caught_up(api)

    version = injected["metadata"]["resourceVersion"]
    holds(
        lambda: read(api, namespace, "steady")["metadata"]["resourceVersion"] == version,
        3,
        "the injected CronJob left unwritten after the restart",
    )
    assert init_names(read(api, namespace, "steady")) == ["cronlock", GATE]


def test_changing_a_setting_while_the_operator_is_down_updates_the_injection_once(
    api: kubernetes.client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    manifest = gen.cronjob("retuned", *UNGUARDED)
    manifest["metadata"]["annotations"] = {"cronlock.io/enabled": "true", "cronlock.io/ttl": "30s"}
    batch(api).create_namespaced_cron_job(namespace, manifest)
    wait_for(lambda: "cronlock" in init_names(read(api, namespace, "retuned")), 30, "injection")

    operator.stop()
    try:
        annotate(api, namespace, "retuned", ttl="90s")
    finally:
        operator.start()

    def ttl_env() -> str | None:
        sidecar = read(api, namespace, "retuned")["spec"]["jobTemplate"]["spec"]["template"][
            "spec"
        ]["initContainers"][0]
        return next(e["value"] for e in sidecar["env"] if e["name"] == "CRONLOCK_TTL")

    wait_for(lambda: ttl_env() == "1m30s", 30, "the new ttl in the sidecar")
    assert init_names(read(api, namespace, "retuned")) == ["cronlock", GATE]


def test_kubectl_apply_of_the_original_manifest_keeps_the_injection(
    controlplane: ControlPlane,
    api: kubernetes.client.ApiClient,
    namespace: str,
    operator: OperatorProcess,
) -> None:
    manifest = gen.cronjob("applied", *UNGUARDED)
    manifest["metadata"]["annotations"] = {"cronlock.io/enabled": "true"}
    text = yaml.safe_dump(manifest)
    controlplane.kubectl("apply", "-n", namespace, "-f", "-", input_text=text)
    wait_for(lambda: "cronlock" in init_names(read(api, namespace, "applied")), 30, "injection")

    controlplane.kubectl("apply", "-n", namespace, "-f", "-", input_text=text)
    operator_caught_up(api)

    holds(
        lambda: init_names(read(api, namespace, "applied")) == ["cronlock", GATE],
        2,
        "the injection kept after the second apply",
    )


BAD_SETTINGS = [
    ("ttl", "abc"),
    ("ttl", "2s"),
    ("renew", "45s"),
    ("policy", "sometimes"),
    ("alert-after", "zero"),
    ("stop", "politely"),
    ("lock", "Not_A_Valid_Name"),
    ("colour", "blue"),
]


@pytest.mark.parametrize(("key", "value"), BAD_SETTINGS)
def test_bad_settings_post_invalid_config_and_keep_the_last_valid_injection(
    api: kubernetes.client.ApiClient,
    namespace: str,
    operator: OperatorProcess,
    key: str,
    value: str,
) -> None:
    manifest = gen.cronjob("guarded", *UNGUARDED)
    manifest["metadata"]["annotations"] = {"cronlock.io/enabled": "true", "cronlock.io/ttl": "30s"}
    batch(api).create_namespaced_cron_job(namespace, manifest)
    good = wait_for(
        lambda: c if "cronlock" in init_names(c := read(api, namespace, "guarded")) else None,
        timeout=30,
        what="the injection",
    )

    annotate(api, namespace, "guarded", **{key.replace("-", "_"): value})

    messages = wait_event(api, namespace, "guarded", "InvalidConfig")
    assert f"cronlock.io/{key}" in messages[0]
    after = read(api, namespace, "guarded")
    assert after["spec"]["jobTemplate"] == good["spec"]["jobTemplate"]


def test_a_new_cronjob_with_bad_settings_is_left_untouched(
    api: kubernetes.client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    manifest = gen.cronjob("never-valid", *UNGUARDED)
    manifest["metadata"]["annotations"] = {"cronlock.io/enabled": "yes"}
    batch(api).create_namespaced_cron_job(namespace, manifest)
    stored = read(api, namespace, "never-valid")

    messages = wait_event(api, namespace, "never-valid", "InvalidConfig")

    assert "cronlock.io/enabled" in messages[0]
    assert (
        read(api, namespace, "never-valid")["metadata"]["resourceVersion"]
        == stored["metadata"]["resourceVersion"]
    )


def test_a_lock_in_redis_gets_the_stores_sidecar_and_its_secret_and_no_holder_role(
    api: kubernetes.client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """A lock in Redis (or PostgreSQL): the sidecar runs the stores image and reads the
    URL from the named Secret, mounted into it alone; its Lease is a registry of users that
    no holder Role grants; through the chart's operator policy. Switching to the Lease and
    back swaps them."""
    manifest = gen.cronjob("ledger-sync", *UNGUARDED)
    batch(api).create_namespaced_cron_job(namespace, manifest)
    before = comparable(read(api, namespace, "ledger-sync"))
    annotate(
        api,
        namespace,
        "ledger-sync",
        **{"enabled": "true", "store": "redis", "store-secret": "team-locks"},
    )
    injected = wait_for(
        lambda: (
            c if init_names(c := read(api, namespace, "ledger-sync"))[:1] == ["cronlock"] else None
        ),
        timeout=30,
        what="the injection",
    )
    pod_spec = injected["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    sidecar, gate = pod_spec["initContainers"][:2]
    assert sidecar["image"] == SIDECAR_STORES_IMAGE
    assert gate["image"] != SIDECAR_STORES_IMAGE
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert env["CRONLOCK_STORE_FILE"] == "/var/run/cronlock-store/url"
    assert env["CRONLOCK_STORE_KIND"] == "redis"
    assert {"name": "cronlock-store", "mountPath": "/var/run/cronlock-store", "readOnly": True} in (
        sidecar["volumeMounts"]
    )
    for container in [gate, *pod_spec["containers"]]:
        assert "cronlock-store" not in [m["name"] for m in container.get("volumeMounts", [])]
    (volume,) = [v for v in pod_spec["volumes"] if v["name"] == "cronlock-store"]
    assert volume["secret"]["secretName"] == "team-locks"
    assert volume["secret"]["items"] == [{"key": "url", "path": "url"}]
    messages = wait_event(api, namespace, "ledger-sync", "Injected")
    assert any("lock ledger-sync (redis, URL in Secret team-locks)" in m for m in messages)
    # The lock is in Redis, shared with the other cluster; its Lease is only its registry
    # (who uses it, for consent), granted to no pod: no holder Role.
    coordination = kubernetes.client.CoordinationV1Api(api)
    wait_for(
        lambda: _lease_with_owners(coordination, namespace, "cronlock-ledger-sync", 1),
        30,
        "the registry Lease",
    )
    assert not coordination.read_namespaced_lease(
        "cronlock-ledger-sync", namespace
    ).spec.holder_identity
    roles = kubernetes.client.RbacAuthorizationV1Api(api).list_namespaced_role(namespace).items
    assert [role.metadata.name for role in roles] == []
    # Injected once: the stored template (with the API server's defaults) needs no patch.
    version = read(api, namespace, "ledger-sync")["metadata"]["resourceVersion"]
    operator_caught_up(api)
    holds(
        lambda: read(api, namespace, "ledger-sync")["metadata"]["resourceVersion"] == version,
        2,
        "the injected CronJob left unwritten",
    )

    # Back to this cluster's Lease: the Secret's volume goes, the holder Role comes.
    annotate(api, namespace, "ledger-sync", **{"store": None, "store-secret": None})
    wait_for(
        lambda: (
            [
                role.metadata.name
                for role in kubernetes.client.RbacAuthorizationV1Api(api)
                .list_namespaced_role(namespace)
                .items
            ]
            == ["cronlock-holder-default"]
        ),
        30,
        "the holder Role",
    )

    def without_store() -> dict[str, Any] | None:
        body = read(api, namespace, "ledger-sync")
        spec = body["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        return None if "cronlock-store" in [v["name"] for v in spec["volumes"]] else spec

    spec = wait_for(without_store, 30, "the store's volume to go")
    assert spec["initContainers"][0]["image"] != SIDECAR_STORES_IMAGE
    annotate(api, namespace, "ledger-sync", enabled=None)
    wait_for(
        lambda: comparable(read(api, namespace, "ledger-sync")) == before or None,
        30,
        "the revert",
    )


def test_two_cronjobs_sharing_a_lock_share_one_lease_and_their_pods_may_hold_only_it(
    api: kubernetes.client.ApiClient,
    namespace: str,
    operator: OperatorProcess,
    controlplane: ControlPlane,
    tmp_path: Path,
) -> None:
    core = kubernetes.client.CoreV1Api(api)
    for account in ("reports", "exports"):
        core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    for name, account in (("daily-report", "reports"), ("daily-export", "exports")):
        manifest = gen.cronjob(name, *UNGUARDED, gen.service_account(account))
        manifest["metadata"]["annotations"] = {
            "cronlock.io/enabled": "true",
            "cronlock.io/lock": "ledger",
            "cronlock.io/share-lock-with": "daily-report,daily-export",
        }
        batch(api).create_namespaced_cron_job(namespace, manifest)
    unrelated = gen.cronjob("unrelated", *UNGUARDED)
    unrelated["metadata"]["annotations"] = {"cronlock.io/enabled": "true"}
    batch(api).create_namespaced_cron_job(namespace, unrelated)
    leases = kubernetes.client.CoordinationV1Api(api)

    lease = wait_for(
        lambda: _lease_with_owners(leases, namespace, "cronlock-ledger", 2), 30, "the shared Lease"
    )

    assert {owner.name for owner in lease.metadata.owner_references} == {
        "daily-report",
        "daily-export",
    }
    assert lease.metadata.labels["app.kubernetes.io/managed-by"] == "cronlock"
    # A pod on the account, with a token bound to it as the kubelet's are (the holders'
    # policy refuses any other token of the account).
    pod = core.create_namespaced_pod(namespace, gen.pod("test-pod", "reports"))
    bound = make_service_account_kubeconfig(
        controlplane, api, namespace, "reports", tmp_path, bound_pod=("test-pod", pod.metadata.uid)
    )
    as_reports = kubernetes.client.CoordinationV1Api(controlplane.api_client(bound))
    wait_for(lambda: _can_get(as_reports, namespace, "cronlock-ledger"), 30, "the holder Role")
    mine = as_reports.read_namespaced_lease("cronlock-ledger", namespace)
    # A claim, as the sidecar writes one: as itself, and one more transition.
    mine.spec.holder_identity = f"test-pod_{pod.metadata.uid[:8]}"
    mine.spec.renew_time = datetime.datetime.now(datetime.UTC).replace(microsecond=123456)
    mine.spec.lease_transitions = (mine.spec.lease_transitions or 0) + 1
    as_reports.replace_namespaced_lease("cronlock-ledger", namespace, mine)
    # The job's identity may hold its locks and nothing else in the namespace.
    wait_for(lambda: _lease_with_owners(leases, namespace, "cronlock-unrelated", 1), 30, "Lease")
    for forbidden in (
        lambda: as_reports.read_namespaced_lease("cronlock-unrelated", namespace),
        lambda: as_reports.list_namespaced_lease(namespace),
        lambda: as_reports.create_namespaced_lease(namespace, {"metadata": {"name": "cronlock-x"}}),
        lambda: as_reports.delete_namespaced_lease("cronlock-ledger", namespace),
    ):
        with pytest.raises(kubernetes.client.ApiException) as denied:
            forbidden()
        assert denied.value.status == 403


def _lease_with_owners(leases: Any, namespace: str, name: str, owners: int) -> Any:
    try:
        lease = leases.read_namespaced_lease(name, namespace)
    except kubernetes.client.ApiException as error:
        if error.status == 404:
            return None
        raise
    return lease if len(lease.metadata.owner_references or []) >= owners else None


def _can_get(leases: Any, namespace: str, name: str) -> bool:
    try:
        leases.read_namespaced_lease(name, namespace)
    except kubernetes.client.ApiException as error:
        if error.status == 403:
            return False
        raise
    return True


def _guarded(
    api: kubernetes.client.ApiClient, namespace: str, name: str, **settings: str
) -> dict[str, Any]:
    manifest = gen.cronjob(name, *UNGUARDED)
    manifest["metadata"]["annotations"] = {
        "cronlock.io/enabled": "true",
        **{f"cronlock.io/{key.replace('_', '-')}": value for key, value in settings.items()},
    }
    batch(api).create_namespaced_cron_job(namespace, manifest)
    return wait_for(
        lambda: c if "cronlock" in init_names(c := read(api, namespace, name)) else None,
        timeout=30,
        what="the injection",
    )


def _run(
    api: kubernetes.client.ApiClient,
    namespace: str,
    cronjob_body: dict[str, Any],
    job: str,
    *,
    gate_exit: int,
    main_exit: int = 0,
    gate_message: str | None = None,
) -> str:
    """A manual run whose pod the test finishes the way the kubelet would report it; the
    pod's name."""
    batch(api).create_namespaced_job(namespace, job_from_cronjob(cronjob_body, job))
    core = kubernetes.client.CoreV1Api(api)
    pod = wait_for(
        lambda: core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items,
        timeout=30,
        what=f"the Job controller to create a pod for {job}",
    )[0]
    finish_pod(
        core,
        namespace,
        pod.metadata.name,
        gate_exit=gate_exit,
        main_exit=main_exit,
        gate_message=gate_message,
    )
    return str(pod.metadata.name)


def _skips(api: kubernetes.client.ApiClient, namespace: str, name: str) -> int:
    annotations = read(api, namespace, name)["metadata"].get("annotations") or {}
    return int(annotations.get("cronlock.io/consecutive-skips", "0"))


def _job_exists(api: kubernetes.client.ApiClient, namespace: str, name: str) -> bool:
    try:
        batch(api).read_namespaced_job(name, namespace)
    except kubernetes.client.ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def test_skipped_runs_are_counted_alerted_and_cleaned_up_and_a_success_resets_the_count(
    api: kubernetes.client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    body = _guarded(api, namespace, "busy", alert_after="2")

    _run(api, namespace, body, "busy-1", gate_exit=75)

    skipped = wait_event(api, namespace, "busy", "Skipped")
    assert "busy-1" in skipped[0]
    wait_for(lambda: _skips(api, namespace, "busy") == 1, 30, "consecutive-skips 1")
    wait_for(lambda: not _job_exists(api, namespace, "busy-1"), 30, "the skipped Job deleted")
    job_failure = [m for _, r, m in events(api, namespace, "busy") if r == "RepeatedSkips"]
    assert job_failure == []

    _run(api, namespace, body, "busy-2", gate_exit=75)

    alert = wait_event(api, namespace, "busy", "RepeatedSkips")
    assert "2 runs in a row" in alert[0]
    wait_for(lambda: _skips(api, namespace, "busy") == 2, 30, "consecutive-skips 2")

    _run(api, namespace, body, "busy-3", gate_exit=0, main_exit=0)

    wait_for(lambda: _skips(api, namespace, "busy") == 0, 30, "the count reset by a success")
    assert _job_exists(api, namespace, "busy-3"), "a successful run's Job is the CronJob's to clean"


def test_keep_skipped_jobs_keeps_the_failed_job_and_other_failures_are_not_skips(
    api: kubernetes.client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    body = _guarded(api, namespace, "kept", keep_skipped_jobs="true")

    _run(api, namespace, body, "kept-1", gate_exit=75)
    wait_event(api, namespace, "kept", "Skipped")
    _run(api, namespace, body, "kept-2", gate_exit=69)

    # No marker orders the Jobs' watch after this run (operator_caught_up follows the
    # CronJobs' watch): a window, long enough for the operator to judge a finished Job.
    holds(
        lambda: (
            _job_exists(api, namespace, "kept-1")
            and _skips(api, namespace, "kept") == 1
            and len([r for _, r, _ in events(api, namespace, "kept") if r == "Skipped"]) == 1
        ),
        3,
        "the kept skip alone counted: the work's own failure is no skip",
    )
    # The kept skip is labelled for KubeJobFailed's exclusion; the work's own failure not.
    labels = {
        name: batch(api).read_namespaced_job(name, namespace).metadata.labels
        for name in ("kept-1", "kept-2")
    }
    assert labels["kept-1"]["cronlock.io/outcome"] == "skipped"
    assert "cronlock.io/outcome" not in labels["kept-2"]


def _already_ran(job: str) -> str:
    """The gate's line for `job`'s tick, as ticks.skip_line writes it."""
    return (
        f"already ran: tick 2026-12-06T12:00:00Z of ticking on lock ticking was claimed by "
        f"job {job}-other (run uid-other, holder pod-other, cluster east) for tick "
        "2026-12-06T12:00:00Z; skipping this run"
    )


def _reasons(api: kubernetes.client.ApiClient, namespace: str, name: str) -> list[str]:
    return [reason for _, reason, _ in events(api, namespace, name)]


def test_a_skip_whose_gate_said_already_ran_is_a_tick_already_ran_event_not_a_skip(
    api: kubernetes.client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """Issue 56: the Job's own pod's gate exited 75 saying `already ran: ...`: a Normal
    TickAlreadyRan Event with that line, no skip in a row, the Job cleaned up as a skip's.
    A gate that exited 75 for a held lock stays a Skipped one."""
    body = _guarded(api, namespace, "ticking", alert_after="2")
    line = _already_ran("ticking-29416320")

    _run(api, namespace, body, "ticking-29416320", gate_exit=75, gate_message=line)

    said = wait_event(api, namespace, "ticking", "TickAlreadyRan")
    assert said[0] == f"run ticking-29416320: {line}"
    wait_for(lambda: not _job_exists(api, namespace, "ticking-29416320"), 30, "the Job deleted")
    assert _skips(api, namespace, "ticking") == 0
    assert "Skipped" not in _reasons(api, namespace, "ticking")
    normal = [
        event.type
        for event in kubernetes.client.CoreV1Api(api).list_namespaced_event(namespace).items
        if event.reason == "TickAlreadyRan"
    ]
    assert normal == ["Normal"]

    # A held lock: the gate's message says so; a skip, the first in a row.
    _run(api, namespace, body, "ticking-29416321", gate_exit=75, gate_message="lease is held")
    wait_for(lambda: _skips(api, namespace, "ticking") == 1, 30, "consecutive-skips 1")
    skipped = wait_event(api, namespace, "ticking", "Skipped")
    assert skipped[0] == (
        "run ticking-29416321 skipped: lock ticking was held by another run (1 in a row)"
    )
    assert _reasons(api, namespace, "ticking").count("TickAlreadyRan") == 1


def test_a_forged_job_whose_gate_says_already_ran_is_no_tick_already_ran(
    api: kubernetes.client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """From the attacker's side: anyone who may create Jobs names the CronJob as their
    Job's owner and gives it a `cronlock-gate` of their own that exits 75 saying
    `already ran`, to pass skips off as ticks worked elsewhere. Its cronlock containers are
    not the CronJob's (skips.went_through_the_lock): a plain skip, counted in a row, and no
    TickAlreadyRan Event carries the forger's text. The legitimate Job on the same set-up
    is told."""
    body = _guarded(api, namespace, "forged", alert_after="5")
    forged = copy.deepcopy(body)
    spec = forged["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    gate = next(c for c in spec["initContainers"] if c["name"] == GATE)
    gate["command"] = ["sh", "-c", "echo 'already ran: trust me' >/dev/termination-log; exit 75"]

    _run(
        api,
        namespace,
        forged,
        "forged-29416320",
        gate_exit=75,
        gate_message="already ran: trust me",
    )
    wait_for(lambda: _skips(api, namespace, "forged") == 1, 30, "the forged run counted a skip")
    assert "TickAlreadyRan" not in _reasons(api, namespace, "forged")

    line = _already_ran("forged-29416321")
    _run(api, namespace, body, "forged-29416321", gate_exit=75, gate_message=line)
    said = wait_event(api, namespace, "forged", "TickAlreadyRan")
    assert said == [f"run forged-29416321: {line}"]
    assert _skips(api, namespace, "forged") == 1


def test_a_holder_that_stops_renewing_is_cleared_with_lease_expired(
    api: kubernetes.client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    _guarded(api, namespace, "stale")
    leases = kubernetes.client.CoordinationV1Api(api)
    lease = wait_for(
        lambda: _lease_with_owners(leases, namespace, "cronlock-stale", 1), 30, "Lease"
    )
    lease.spec.holder_identity = "vanished-pod_0badf00d"
    lease.spec.lease_duration_seconds = 3
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=500000)
    lease.spec.renew_time = now
    lease.spec.acquire_time = now
    leases.replace_namespaced_lease("cronlock-stale", namespace, lease)

    message = wait_event(api, namespace, "stale", "LeaseExpired")

    assert "vanished-pod_0badf00d" in message[0]
    cleared = leases.read_namespaced_lease("cronlock-stale", namespace)
    assert not cleared.spec.holder_identity
    assert cleared.metadata.annotations["cronlock.io/last-holder"] == "vanished-pod_0badf00d"


def test_an_operator_killed_mid_burst_leaves_nothing_half_done(
    api: kubernetes.client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    operator.stop()
    names = [f"burst-{index}" for index in range(40)]
    try:
        for name in names:
            manifest = gen.cronjob(name, *UNGUARDED)
            manifest["metadata"]["annotations"] = {"cronlock.io/enabled": "true"}
            batch(api).create_namespaced_cron_job(namespace, manifest)
        operator.start()

        def injected_names() -> set[str]:
            items = batch(api).list_namespaced_cron_job(namespace).items
            return {
                item.metadata.name
                for item in items
                if "cronlock" in init_names(api.sanitize_for_serialization(item))
            }

        wait_for(lambda: injected_names() or None, timeout=30, what="the first injections")
        operator.kill()  # mid-burst, most likely mid-reconcile of some CronJob
    finally:
        if operator.process is None:
            operator.start()

    wait_for(lambda: injected_names() == set(names), timeout=60, what="every CronJob injected")
    leases = kubernetes.client.CoordinationV1Api(api)
    for name in names:
        stored = read(api, namespace, name)
        assert init_names(stored) == ["cronlock", GATE], name
        rules = stored["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"]
        assert len(rules) == 1, name
        lease = leases.read_namespaced_lease(f"cronlock-{name}", namespace)
        assert [owner.name for owner in lease.metadata.owner_references] == [name]
    role = kubernetes.client.RbacAuthorizationV1Api(api).read_namespaced_role(
        "cronlock-holder-default", namespace
    )
    assert set(role.rules[0].resource_names) == {f"cronlock-{name}" for name in names}
