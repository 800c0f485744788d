"""The chart's ValidatingAdmissionPolicy, tried with the operator's own token: what its RBAC
allows beyond cronlock's own objects is refused by the API server.

The session's `operator_kubeconfig` installs the chart's RBAC and this policy, so every
other integration and end-to-end test shows the operator's real work passes it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from cronlock_operator.cronjob.config import parse_config
from cronlock_operator.injection.build import build_injection, revert
from cronlock_operator.injection.patching import injection_patch
from cronlock_operator.settings import OperatorSettings
from tests.support import gen
from tests.support.controlplane import ControlPlane
from tests.support.kube import holds
from tests.support.objects import comparable, events, has_sidecar, read, wait_event
from tests.support.operator import (
    CHART,
    OPERATOR_NAMESPACE,
    SIDECAR_IMAGE,
    SIDECAR_STORES_IMAGE,
    OperatorProcess,
    operator_caught_up,
)

OURS = {"app.kubernetes.io/managed-by": "cronlock"}
# The operator's settings in these tests: the sidecar image and the stores image.
WITH_STORES = OperatorSettings(
    sidecar_image=SIDECAR_IMAGE, sidecar_stores_image=SIDECAR_STORES_IMAGE
)


@pytest.fixture
def as_operator(
    controlplane: ControlPlane, operator_kubeconfig: Path
) -> kubernetes.client.ApiClient:
    return controlplane.api_client(operator_kubeconfig)


def refused(call: Callable[[], Any]) -> str:
    with pytest.raises(kubernetes.client.ApiException) as caught:
        call()
    assert caught.value.status in (403, 422), caught.value.body
    return str(caught.value.body)


def test_the_operator_cannot_touch_node_heartbeats_or_system_leases(
    api: kubernetes.client.ApiClient, as_operator: kubernetes.client.ApiClient
) -> None:
    leases = kubernetes.client.CoordinationV1Api(as_operator)
    admin_leases = kubernetes.client.CoordinationV1Api(api)
    node_leases = admin_leases.list_namespaced_lease("kube-node-lease").items
    if node_leases:
        heartbeat = node_leases[0].metadata.name
    else:  # no node registered in this ring: a heartbeat-shaped Lease of its own
        heartbeat = "node-a"
        admin_leases.create_namespaced_lease(
            "kube-node-lease",
            {"metadata": {"name": heartbeat}, "spec": {"holderIdentity": heartbeat}},
        )
    body = refused(
        lambda: leases.patch_namespaced_lease(
            heartbeat, "kube-node-lease", {"spec": {"holderIdentity": "stolen"}}
        )
    )
    assert "never writes in kube-system or kube-node-lease" in body
    refused(
        lambda: leases.create_namespaced_lease(
            "kube-system", {"metadata": {"name": "cronlock-x", "labels": OURS}}
        )
    )


def test_the_operator_cannot_write_leases_it_did_not_make(
    api: kubernetes.client.ApiClient, as_operator: kubernetes.client.ApiClient, namespace: str
) -> None:
    leases = kubernetes.client.CoordinationV1Api(as_operator)
    kubernetes.client.CoordinationV1Api(api).create_namespaced_lease(
        namespace, {"metadata": {"name": "leader"}, "spec": {"holderIdentity": "app-1"}}
    )
    body = refused(
        lambda: leases.patch_namespaced_lease("leader", namespace, {"metadata": {"labels": OURS}})
    )
    assert "only objects labelled app.kubernetes.io/managed-by=cronlock" in body
    refused(lambda: leases.delete_namespaced_lease("leader", namespace))
    refused(lambda: leases.create_namespaced_lease(namespace, {"metadata": {"name": "unlabelled"}}))
    # Its own kind of Lease it may create, change and delete.
    leases.create_namespaced_lease(namespace, {"metadata": {"name": "cronlock-x", "labels": OURS}})
    leases.patch_namespaced_lease("cronlock-x", namespace, {"spec": {"leaseDurationSeconds": 30}})
    leases.delete_namespaced_lease("cronlock-x", namespace)


def test_the_operator_cannot_mint_rbac_for_anyone(
    as_operator: kubernetes.client.ApiClient, namespace: str
) -> None:
    rbac = kubernetes.client.RbacAuthorizationV1Api(as_operator)
    wide_role = {
        "metadata": {"name": "cronlock-holder-ci", "labels": OURS},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
    }
    # RBAC alone refuses what the operator itself lacks; the policy refuses the rest.
    refused(lambda: rbac.create_namespaced_role(namespace, wide_role))
    lease_role = {
        "metadata": {"name": "admin-tools", "labels": OURS},
        "rules": [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]}
        ],
    }
    assert "only holder Roles" in refused(
        lambda: rbac.create_namespaced_role(namespace, lease_role)
    )
    to_cluster_role = {
        "metadata": {"name": "cronlock-holder-ci", "labels": OURS},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": f"cronlock-{OPERATOR_NAMESPACE}",  # the operator's own (chart: clusterName)
        },
        "subjects": [{"kind": "ServiceAccount", "name": "ci", "namespace": namespace}],
    }
    body = refused(lambda: rbac.create_namespaced_role_binding(namespace, to_cluster_role))
    assert "binds only its holder Role" in body
    # A holder Role and its binding, as the operator writes them, pass.
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "cronlock-holder-ci", "labels": OURS},
            "rules": [
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "resourceNames": ["cronlock-report"],
                    "verbs": ["get", "update", "patch"],
                }
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            **to_cluster_role,
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "cronlock-holder-ci",
            },
        },
    )


def test_the_operators_cronjob_patches_can_neither_switch_account_nor_image_nor_schedule(
    api: kubernetes.client.ApiClient, as_operator: kubernetes.client.ApiClient, namespace: str
) -> None:
    """A stolen operator token may still wrap a job template in cronlock's containers, but
    not run the user's containers as another account or from another image."""
    batch = kubernetes.client.BatchV1Api(as_operator)
    kubernetes.client.BatchV1Api(api).create_namespaced_cron_job(
        namespace,
        gen.cronjob("plain", *gen.BY_HAND, gen.not_opted_in()),
    )
    pod = "/spec/jobTemplate/spec/template/spec"

    def patch(*ops: dict[str, Any]) -> Any:
        return batch.patch_namespaced_cron_job(
            "plain", namespace, list(ops), _content_type="application/json-patch+json"
        )

    body = refused(lambda: patch({"op": "add", "path": f"{pod}/serviceAccountName", "value": "x"}))
    assert "never changes the account" in body
    body = refused(
        lambda: patch({"op": "replace", "path": f"{pod}/containers/0/image", "value": "evil:1"})
    )
    assert "never changes the image of a container it did not add" in body
    body = refused(lambda: patch({"op": "replace", "path": "/spec/schedule", "value": "* * * * *"}))
    assert "changes only a CronJob's job template and its cronlock.io annotations" in body
    refused(
        lambda: patch({"op": "add", "path": "/metadata/annotations", "value": {"team": "evil"}})
    )
    # Nor add a container of cronlock's name that is not cronlock's sidecar, or a
    # cronlock.io annotation it does not keep (what injection does write passes:
    # test_the_operators_token_can_write_exactly_cronlocks_injection_and_its_revert).
    sidecar = {"name": "cronlock", "image": "cronlock:any", "restartPolicy": "Always"}
    refused(lambda: patch({"op": "add", "path": f"{pod}/initContainers", "value": [sidecar]}))
    refused(
        lambda: patch(
            {"op": "add", "path": "/metadata/annotations", "value": {"cronlock.io/x": "1"}}
        )
    )


# --- N1: the injection, and nothing else --------------------------------------------------

POD = "/spec/jobTemplate/spec/template/spec"


@pytest.fixture
def plain_cronjob(api: kubernetes.client.ApiClient, namespace: str) -> str:
    """A CronJob as a user wrote it (not opted in: no operator acts on it here)."""
    body = gen.cronjob("invoices", gen.in_namespace(None), gen.never_due(), gen.not_opted_in())
    body["spec"]["jobTemplate"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 90
    kubernetes.client.BatchV1Api(api).create_namespaced_cron_job(namespace, body)
    return "invoices"


def json_patch(
    client: kubernetes.client.ApiClient, namespace: str, name: str, *ops: dict[str, Any]
) -> Any:
    return kubernetes.client.BatchV1Api(client).patch_namespaced_cron_job(
        name, namespace, list(ops), _content_type="application/json-patch+json", dry_run="All"
    )


def opted_in(
    api: kubernetes.client.ApiClient, namespace: str, name: str, annotations: dict[str, str]
) -> dict[str, Any]:
    """The user's CronJob `name` opted in with `annotations` (written as an admin), as the
    API server stored it: what the operator's patch then starts from."""
    batch = kubernetes.client.BatchV1Api(api)
    stored = api.sanitize_for_serialization(batch.read_namespaced_cron_job(name, namespace))
    stored["metadata"]["annotations"] = annotations
    result: dict[str, Any] = api.sanitize_for_serialization(
        batch.replace_namespaced_cron_job(name, namespace, stored)
    )
    return result


def test_the_operators_token_can_write_exactly_cronlocks_injection_and_its_revert(
    api: kubernetes.client.ApiClient,
    as_operator: kubernetes.client.ApiClient,
    namespace: str,
    plain_cronjob: str,
) -> None:
    """What the operator's own code writes passes the policy, in every stop mode (the
    policy and containers.py/injection.py describe the same injection)."""
    batch = kubernetes.client.BatchV1Api(as_operator)
    settings = WITH_STORES
    for opted_in, grace in (
        ({"cronlock.io/enabled": "true"}, 90),
        # A lock in Redis: the stores image and the named Secret's url, in the sidecar only.
        (
            {
                "cronlock.io/enabled": "true",
                "cronlock.io/store": "redis",
                "cronlock.io/store-secret": "team-locks",
            },
            90,
        ),
        ({"cronlock.io/enabled": "true", "cronlock.io/stop": "signal"}, 90),
        # A lock of its own name: CRONLOCK_LEASE names that lock's Lease.
        ({"cronlock.io/enabled": "true", "cronlock.io/lock": "ledger"}, 90),
        ({"cronlock.io/enabled": "true", "cronlock.io/stop": "liveness"}, 90),
        # A bound: CRONLOCK_MAX_HOLD is one of the injection's own variables.
        ({"cronlock.io/enabled": "true", "cronlock.io/max-hold": "2h"}, 90),
        # No grace written: the API server defaults it to 30, which the revert restores.
        ({"cronlock.io/enabled": "true", "cronlock.io/ttl": "5m"}, None),
    ):
        stored = api.sanitize_for_serialization(
            kubernetes.client.BatchV1Api(api).read_namespaced_cron_job(plain_cronjob, namespace)
        )
        # The user opts in (as an admin here); the operator's patch follows.
        stored["metadata"]["annotations"] = opted_in
        pod = stored["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        pod["containers"][0]["securityContext"] = {"runAsUser": 1000}
        pod["terminationGracePeriodSeconds"] = grace
        stored = api.sanitize_for_serialization(
            kubernetes.client.BatchV1Api(api).replace_namespaced_cron_job(
                plain_cronjob, namespace, stored
            )
        )
        desired = build_injection(stored, parse_config(stored, settings), settings)
        injected_now = batch.patch_namespaced_cron_job(
            plain_cronjob,
            namespace,
            injection_patch(stored, desired),
            _content_type="application/json-patch+json",
        )
        injected_body = as_operator.sanitize_for_serialization(injected_now)
        # Stored as built: the sidecar with the image of this lock's kind, and the same
        # annotations (the records of what the injection changed among them).
        assert has_sidecar(injected_body), opted_in
        sidecar = next(
            container
            for container in injected_body["spec"]["jobTemplate"]["spec"]["template"]["spec"][
                "initContainers"
            ]
            if container["name"] == "cronlock"
        )
        wanted = SIDECAR_STORES_IMAGE if "cronlock.io/store" in opted_in else SIDECAR_IMAGE
        assert sidecar["image"] == wanted, opted_in
        assert injected_body["metadata"]["annotations"] == desired["metadata"]["annotations"]
        reverted_now = batch.patch_namespaced_cron_job(
            plain_cronjob,
            namespace,
            injection_patch(injected_body, revert(injected_body)),
            _content_type="application/json-patch+json",
        )
        # The revert gives back exactly what the user's write stored (grace 30 included
        # where the API server defaulted it).
        reverted = as_operator.sanitize_for_serialization(reverted_now)
        assert not has_sidecar(reverted), opted_in
        assert comparable(reverted) == comparable(stored), opted_in


def _success_volume_hostpath(pod: dict[str, Any]) -> None:
    for volume in pod["volumes"]:
        if volume["name"] == "cronlock-success":
            del volume["emptyDir"]
            volume["hostPath"] = {"path": "/var/lib/kubelet"}


def _sidecar_writes_success(pod: dict[str, Any]) -> None:
    for mount in pod["initContainers"][0]["volumeMounts"]:
        if mount["name"] == "cronlock-success":
            mount["readOnly"] = False


def _work_mounts_success_elsewhere(pod: dict[str, Any]) -> None:
    for mount in pod["containers"][0]["volumeMounts"]:
        if mount["name"] == "cronlock-success":
            mount["mountPath"] = "/etc"


def _work_mounts_success_subpath(pod: dict[str, Any]) -> None:
    for mount in pod["containers"][0]["volumeMounts"]:
        if mount["name"] == "cronlock-success":
            mount["subPath"] = "x"


def _gate_mounts_success(pod: dict[str, Any]) -> None:
    pod["initContainers"][1]["volumeMounts"].append(
        {"name": "cronlock-success", "mountPath": "/var/run/cronlock-success"}
    )


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (_success_volume_hostpath, "and the cronlock-success emptyDir"),
        (_sidecar_writes_success, "run only the configured sidecar image"),
        (_gate_mounts_success, "run only the configured sidecar image"),
        (_work_mounts_success_elsewhere, "for a lock in a store its cronlock-success mount"),
        (_work_mounts_success_subpath, "for a lock in a store its cronlock-success mount"),
    ],
)
def test_the_success_volume_is_an_emptydir_the_work_writes_and_the_sidecar_only_reads(
    api: kubernetes.client.ApiClient,
    as_operator: kubernetes.client.ApiClient,
    namespace: str,
    plain_cronjob: str,
    change: Callable[[dict[str, Any]], None],
    said: str,
) -> None:
    """Issue 56: on a lock in a store the work says its tick succeeded in an emptyDir of its
    own. The operator's token may add it as injection builds it (the test above), and no
    other way: not as a host path, not writable by the sidecar, not in the gate, not
    mounted elsewhere or by subPath in the work's containers, and never on a Lease lock."""
    settings = WITH_STORES
    stored = opted_in(
        api,
        namespace,
        plain_cronjob,
        {
            "cronlock.io/enabled": "true",
            "cronlock.io/store": "redis",
            "cronlock.io/store-secret": "team-locks",
        },
    )
    desired = build_injection(stored, parse_config(stored, settings), settings)

    def patch(body: dict[str, Any]) -> Any:
        return kubernetes.client.BatchV1Api(as_operator).patch_namespaced_cron_job(
            plain_cronjob,
            namespace,
            injection_patch(stored, body),
            _content_type="application/json-patch+json",
            dry_run="All",
        )

    patch(desired)  # as built: admitted
    changed = json.loads(json.dumps(desired))
    change(changed["spec"]["jobTemplate"]["spec"]["template"]["spec"])
    assert said in refused(lambda: patch(changed))
    # On a Lease lock the operator records success itself: the volume is refused there.
    stored = opted_in(api, namespace, plain_cronjob, {"cronlock.io/enabled": "true"})
    on_lease = build_injection(stored, parse_config(stored, settings), settings)
    patch(on_lease)  # as built: admitted
    pod = on_lease["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    pod["volumes"].append({"name": "cronlock-success", "emptyDir": {}})
    assert "cronlock-success" in refused(lambda: patch(on_lease))


@pytest.mark.parametrize(
    ("ops", "said"),
    [
        # a) a privileged hostPath init container, inserted first, tolerating every taint
        (
            [
                {
                    "op": "add",
                    "path": f"{POD}/volumes",
                    "value": [{"name": "host", "hostPath": {"path": "/"}}],
                },
                {
                    "op": "add",
                    "path": f"{POD}/initContainers",
                    "value": [
                        {
                            "name": "cronlock-x",
                            "image": "busybox:1.36",
                            "command": ["sh", "-c", "chroot /host id"],
                            "securityContext": {"privileged": True, "runAsUser": 0},
                            "volumeMounts": [{"name": "host", "mountPath": "/host"}],
                        }
                    ],
                },
                {"op": "add", "path": f"{POD}/tolerations", "value": [{"operator": "Exists"}]},
            ],
            "",
        ),
        # b) any Secret of the namespace, read by an added container
        (
            [
                {
                    "op": "add",
                    "path": f"{POD}/volumes",
                    "value": [{"name": "s", "secret": {"secretName": "db"}}],
                },
                {
                    "op": "add",
                    "path": f"{POD}/initContainers",
                    "value": [
                        {
                            "name": "cronlock",
                            "image": SIDECAR_IMAGE,
                            "command": ["cat", "/s/password"],
                            "volumeMounts": [{"name": "s", "mountPath": "/s"}],
                        }
                    ],
                },
            ],
            "",
        ),
        # a store's volume naming a Secret the CronJob did not name (it names none)
        (
            [
                {
                    "op": "add",
                    "path": f"{POD}/volumes",
                    "value": [
                        {
                            "name": "cronlock-store",
                            "secret": {
                                "secretName": "db-admin",
                                "items": [{"key": "url", "path": "url"}],
                            },
                        }
                    ],
                },
            ],
            "the key url of the Secret named by the CronJob's cronlock.io/store-secret",
        ),
        # ... or every key of it
        (
            [
                {
                    "op": "add",
                    "path": f"{POD}/volumes",
                    "value": [{"name": "cronlock-store", "secret": {"secretName": "db-admin"}}],
                },
            ],
            "the key url of the Secret named by the CronJob's cronlock.io/store-secret",
        ),
        # the stores image as the gate (only the sidecar may run it)
        (
            [
                {
                    "op": "add",
                    "path": f"{POD}/initContainers",
                    "value": [
                        {
                            "name": "cronlock-gate",
                            "image": SIDECAR_STORES_IMAGE,
                            "command": ["cronlock-sidecar", "gate"],
                        }
                    ],
                }
            ],
            "run only the configured sidecar image",
        ),
        # cronlock's own container name, with another image
        (
            [
                {
                    "op": "add",
                    "path": f"{POD}/initContainers",
                    "value": [
                        {
                            "name": "cronlock",
                            "image": "evil:1",
                            "command": ["cronlock-sidecar", "hold"],
                        }
                    ],
                }
            ],
            "run only the configured sidecar image",
        ),
        # the sidecar image with a postStart hook of its own
        (
            [
                {
                    "op": "add",
                    "path": f"{POD}/initContainers",
                    "value": [
                        {
                            "name": "cronlock",
                            "image": SIDECAR_IMAGE,
                            "command": ["cronlock-sidecar", "hold"],
                            "restartPolicy": "Always",
                            "lifecycle": {
                                "postStart": {"exec": {"command": ["python3", "-c", "1"]}}
                            },
                            "securityContext": {
                                "runAsNonRoot": True,
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                                "readOnlyRootFilesystem": True,
                                "seccompProfile": {"type": "RuntimeDefault"},
                            },
                        }
                    ],
                }
            ],
            "run only the configured sidecar image",
        ),
        # the user's own container: its command, its environment from a Secret
        (
            [
                {
                    "op": "replace",
                    "path": f"{POD}/containers/0/command",
                    "value": ["sh", "-c", "curl evil"],
                }
            ],
            "never changes the image of a container it did not add",
        ),
        (
            [
                {
                    "op": "add",
                    "path": f"{POD}/containers/0/envFrom",
                    "value": [{"secretRef": {"name": "db"}}],
                }
            ],
            "never changes the image of a container it did not add",
        ),
        # placement, pod security, runtime
        (
            [{"op": "add", "path": f"{POD}/nodeName", "value": "node-a"}],
            "never changes the account a CronJob's pods run as",
        ),
        (
            [{"op": "add", "path": f"{POD}/securityContext", "value": {"runAsUser": 0}}],
            "never changes the account a CronJob's pods run as",
        ),
        (
            [{"op": "add", "path": f"{POD}/hostUsers", "value": True}],
            "never changes the account a CronJob's pods run as",
        ),
        # the pod's restart policy to anything but Never, a longer grace
        (
            [{"op": "replace", "path": f"{POD}/terminationGracePeriodSeconds", "value": 900}],
            "terminationGracePeriodSeconds only",
        ),
        # the Job around the pods, and the pods' labels (NetworkPolicies select on them)
        (
            [{"op": "add", "path": "/spec/jobTemplate/spec/parallelism", "value": 500}],
            "Job spec only by its podFailurePolicy rule",
        ),
        (
            [
                {
                    "op": "add",
                    "path": "/spec/jobTemplate/spec/template/metadata",
                    "value": {"labels": {"role": "db-admin"}},
                }
            ],
            "Job spec only by its podFailurePolicy rule",
        ),
        # c) opting a CronJob in on its owner's behalf
        (
            [
                {
                    "op": "add",
                    "path": "/metadata/annotations",
                    "value": {"cronlock.io/enabled": "true"},
                }
            ],
            "changes only a CronJob's job template and its cronlock.io annotations",
        ),
    ],
)
def test_the_operators_token_can_add_nothing_to_a_cronjobs_pods_but_cronlocks_sidecar(
    api: kubernetes.client.ApiClient,
    as_operator: kubernetes.client.ApiClient,
    namespace: str,
    plain_cronjob: str,
    ops: list[dict[str, Any]],
    said: str,
) -> None:
    """Security review N1, each step with the operator's own token (server dry-run)."""
    body = refused(lambda: json_patch(as_operator, namespace, plain_cronjob, *ops))
    assert said in body
    # The same patch by an admin is valid: the policy refused it, not the API's validation.
    json_patch(api, namespace, plain_cronjob, *ops)


def test_the_operators_token_cannot_change_what_the_injected_sidecar_is_told(
    api: kubernetes.client.ApiClient,
    as_operator: kubernetes.client.ApiClient,
    namespace: str,
    plain_cronjob: str,
) -> None:
    """Security review L2: the values of the injected variables are the injection's, not
    the writer's: no `observe` policy the CronJob did not ask for, no store URL or holder
    identity, no Lease in another namespace, no stores image for a Lease lock."""
    settings = WITH_STORES
    batch = kubernetes.client.BatchV1Api(api)
    stored = api.sanitize_for_serialization(
        batch.read_namespaced_cron_job(plain_cronjob, namespace)
    )
    stored["metadata"]["annotations"] = {"cronlock.io/enabled": "true"}
    stored = api.sanitize_for_serialization(
        batch.replace_namespaced_cron_job(plain_cronjob, namespace, stored)
    )
    desired = build_injection(stored, parse_config(stored, settings), settings)
    kubernetes.client.BatchV1Api(as_operator).patch_namespaced_cron_job(
        plain_cronjob,
        namespace,
        injection_patch(stored, desired),
        _content_type="application/json-patch+json",
    )
    injected = api.sanitize_for_serialization(
        batch.read_namespaced_cron_job(plain_cronjob, namespace)
    )
    init = injected["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"]
    index = next(i for i, c in enumerate(init) if c["name"] == "cronlock")
    sidecar = f"{POD}/initContainers/{index}"
    names = [e["name"] for e in init[index]["env"]]

    def set_env(name: str, value: str) -> list[dict[str, Any]]:
        if name in names:
            path = f"{sidecar}/env/{names.index(name)}/value"
            return [{"op": "replace", "path": path, "value": value}]
        return [{"op": "add", "path": f"{sidecar}/env/-", "value": {"name": name, "value": value}}]

    for ops in (
        set_env("CRONLOCK_POLICY", "observe"),
        set_env("CRONLOCK_STORE", "redis://attacker.example:6379/0"),
        set_env("CRONLOCK_IDENTITY", "report-29000000-abcde_12345678"),
        set_env("CRONLOCK_LEASE", "kube-system/cronlock-report"),
        set_env("CRONLOCK_STOP", "none"),
        [{"op": "replace", "path": f"{sidecar}/image", "value": SIDECAR_STORES_IMAGE}],
    ):
        body = refused(lambda ops=ops: json_patch(as_operator, namespace, plain_cronjob, *ops))
        assert "run only the configured sidecar image" in body, ops
    # What the injection itself wrote still passes, written again as it was.
    json_patch(as_operator, namespace, plain_cronjob, *set_env("CRONLOCK_POLICY", "skip"))


def test_the_operators_token_cannot_tell_the_sidecar_another_identity_lease_or_version(
    api: kubernetes.client.ApiClient,
    as_operator: kubernetes.client.ApiClient,
    namespace: str,
    plain_cronjob: str,
) -> None:
    """Security review 2026-12-05, L2 residue: with a stolen operator token, the sidecar's
    pod name, uid, namespace and Job (its holder identity: in a store, a live holder's,
    renewed by name) come only from the pod's own fields, CRONLOCK_LEASE is only the
    CronJob's own lock (not another lock of the namespace) and the version one the skew
    check can read (L-N7). The operator's own injection of the same CronJob passes."""
    settings = WITH_STORES
    batch = kubernetes.client.BatchV1Api(api)
    stored = opted_in(
        api,
        namespace,
        plain_cronjob,
        {
            "cronlock.io/enabled": "true",
            "cronlock.io/lock": "ledger",
            "cronlock.io/store": "redis",
            "cronlock.io/store-secret": "team-locks",
        },
    )
    desired = build_injection(stored, parse_config(stored, settings), settings)
    kubernetes.client.BatchV1Api(as_operator).patch_namespaced_cron_job(
        plain_cronjob,
        namespace,
        injection_patch(stored, desired),
        _content_type="application/json-patch+json",
    )
    init = api.sanitize_for_serialization(batch.read_namespaced_cron_job(plain_cronjob, namespace))[
        "spec"
    ]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"]
    index = next(i for i, c in enumerate(init) if c["name"] == "cronlock")
    env = init[index]["env"]
    names = [e["name"] for e in env]
    assert {"name": "CRONLOCK_LEASE", "value": f"{namespace}/cronlock-ledger"} in env

    def set_env(name: str, **variable: Any) -> dict[str, Any]:
        path = f"{POD}/initContainers/{index}/env/{names.index(name)}"
        return {"op": "replace", "path": path, "value": {"name": name, **variable}}

    def field(path: str) -> dict[str, Any]:
        return {"valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}

    live_holder = "invoices-29400001-abcde"
    for ops in (
        # The review's step: the live holder's name and uid, as literal values.
        [
            set_env("CRONLOCK_POD_NAME", value=live_holder),
            set_env("CRONLOCK_POD_UID", value="12345678-aaaa-bbbb-cccc-000000000000"),
        ],
        [set_env("CRONLOCK_POD_NAME", **field("metadata.annotations['holder']"))],
        [set_env("CRONLOCK_POD_UID", **field("metadata.name"))],
        [set_env("CRONLOCK_POD_NAMESPACE", value=namespace)],
        [set_env("CRONLOCK_JOB_NAME", **field("metadata.labels['job-name']"))],
        [set_env("CRONLOCK_JOB_NAME", value="invoices-29400001")],
        # Another lock of the same namespace: the CronJob's name is not its lock.
        [set_env("CRONLOCK_LEASE", value=f"{namespace}/cronlock-invoices")],
        [set_env("CRONLOCK_LEASE", value=f"{namespace}/cronlock-ledger-2")],
        # Not literal: any other variable from a field of the pod.
        [set_env("CRONLOCK_TTL", **field("metadata.annotations['ttl']"))],
        # Versions the skew check cannot read (int('²') raised in the operator).
        [set_env("CRONLOCK_OPERATOR_VERSION", value="\u00b2.1")],
        [set_env("CRONLOCK_OPERATOR_VERSION", value="0.\u00b2")],
        [set_env("CRONLOCK_OPERATOR_VERSION", value="0.1.0 ")],
        [set_env("CRONLOCK_OPERATOR_VERSION", value="latest")],
    ):
        body = refused(lambda ops=ops: json_patch(as_operator, namespace, plain_cronjob, *ops))
        assert "takes CRONLOCK_POD_NAME, _POD_UID, _POD_NAMESPACE and _JOB_NAME" in body, ops
        # The same patch by an admin is valid: the policy refused it, not the API.
        json_patch(api, namespace, plain_cronjob, *ops)
    # The injection's own values, written again, and another version it may stamp.
    json_patch(
        as_operator,
        namespace,
        plain_cronjob,
        set_env("CRONLOCK_POD_NAME", **field("metadata.name")),
        set_env("CRONLOCK_LEASE", value=f"{namespace}/cronlock-ledger"),
        set_env("CRONLOCK_OPERATOR_VERSION", value="1.22.3-rc.1+build.5"),
    )
    # An environment the CronJob's editor changed herself is hers: the operator may still
    # write the annotation it keeps without being blamed for it.
    batch.patch_namespaced_cron_job(
        plain_cronjob,
        namespace,
        [set_env("CRONLOCK_POD_NAME", value=live_holder)],
        _content_type="application/json-patch+json",
    )
    json_patch(
        as_operator,
        namespace,
        plain_cronjob,
        {
            "op": "add",
            "path": "/metadata/annotations/cronlock.io~1consecutive-skips",
            "value": "1",
        },
    )


def test_the_operators_token_reaches_no_job_or_event_outside_cronlocks_runs(
    api: kubernetes.client.ApiClient, as_operator: kubernetes.client.ApiClient, namespace: str
) -> None:
    """Security review N1 d): Jobs and Events are matched too, kube-system included."""
    admin_batch = kubernetes.client.BatchV1Api(api)
    job = {
        "metadata": {"name": "n1-probe"},
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "busybox:never-pulled"}],
                }
            },
        },
    }
    admin_batch.create_namespaced_job(namespace, job)
    batch = kubernetes.client.BatchV1Api(as_operator)
    suspend = {"spec": {"activeDeadlineSeconds": 1, "parallelism": 5}}
    assert "only annotates" in refused(
        lambda: batch.patch_namespaced_job("n1-probe", namespace, suspend, dry_run="All")
    )
    refused(lambda: batch.delete_namespaced_job("n1-probe", namespace, dry_run="All"))
    # A guarded run's Job (labelled cronlock.io/lock): its marks pass, its spec does not.
    admin_batch.patch_namespaced_job(
        "n1-probe", namespace, {"metadata": {"labels": {"cronlock.io/lock": "ledger"}}}
    )
    batch.patch_namespaced_job(
        "n1-probe", namespace, {"metadata": {"annotations": {"cronlock.io/overlapped": "x"}}}
    )
    refused(lambda: batch.patch_namespaced_job("n1-probe", namespace, suspend, dry_run="All"))
    refused(
        lambda: batch.patch_namespaced_job(
            "n1-probe", namespace, {"metadata": {"annotations": {"team": "x"}}}, dry_run="All"
        )
    )
    # Its outcome label, with one of the two values KubeJobFailed's exclusion reads; no
    # other label, value, or removal of one.
    batch.patch_namespaced_job(
        "n1-probe", namespace, {"metadata": {"labels": {"cronlock.io/outcome": "skipped"}}}
    )
    for labels in (
        {"cronlock.io/outcome": "succeeded"},
        {"team": "x"},
        {"cronlock.io/lock": "other"},
        {"cronlock.io/lock": None},
    ):
        assert "only annotates" in refused(
            lambda labels=labels: batch.patch_namespaced_job(
                "n1-probe", namespace, {"metadata": {"labels": labels}}, dry_run="All"
            )
        ), labels
    batch.delete_namespaced_job("n1-probe", namespace, dry_run="All")
    core = kubernetes.client.CoreV1Api(as_operator)

    def event(kind: str, where: str) -> dict[str, Any]:
        return {
            "metadata": {"generateName": "cronlock-"},
            "involvedObject": {"kind": kind, "name": "x", "namespace": where},
            "reason": "Injected",
            "message": "m",
            "type": "Normal",
        }

    core.create_namespaced_event(namespace, event("CronJob", namespace), dry_run="All")
    assert "only creates Events about CronJobs" in refused(
        lambda: core.create_namespaced_event(namespace, event("Pod", namespace), dry_run="All")
    )
    refused(
        lambda: core.create_namespaced_event(
            "kube-system", event("CronJob", "kube-system"), dry_run="All"
        )
    )


def test_the_operators_token_takes_over_no_other_controllers_lease(
    api: kubernetes.client.ApiClient, as_operator: kubernetes.client.ApiClient, namespace: str
) -> None:
    """Security review N7: a holder Role must name its Leases, all cronlock-*; a Lease the
    operator makes is named cronlock-*."""
    rbac = kubernetes.client.RbacAuthorizationV1Api(as_operator)
    wide = {
        "metadata": {"name": "cronlock-holder-wide", "labels": OURS},
        "rules": [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "verbs": ["get", "update"],
            }
        ],
    }
    assert "named cronlock-* Leases" in refused(
        lambda: rbac.create_namespaced_role(namespace, wide, dry_run="All")
    )
    wide["rules"][0]["resourceNames"] = ["some-controller-leader"]
    refused(lambda: rbac.create_namespaced_role(namespace, wide, dry_run="All"))
    leases = kubernetes.client.CoordinationV1Api(as_operator)
    other = {
        "metadata": {"name": "other-controller-leader", "labels": OURS},
        "spec": {"holderIdentity": "x", "leaseDurationSeconds": 15},
    }
    assert "named cronlock-*" in refused(
        lambda: leases.create_namespaced_lease(namespace, other, dry_run="All")
    )


def test_the_policys_field_lists_name_every_field_the_api_server_knows(
    controlplane: ControlPlane,
) -> None:
    """The policy compares the pod template field by field (CEL cannot drop a field): a field
    a Kubernetes bump adds must be named, or a stolen operator token could set it."""
    spec = json.loads(controlplane.kubectl("get", "--raw", "/openapi/v3/apis/batch/v1"))[
        "components"
    ]["schemas"]
    template = (CHART / "templates" / "_scope-policy.tpl").read_text()

    def listed(variable: str) -> set[str]:
        match = re.search(r"\$" + variable + r" := list ((?:\"[^\"]+\" ?)+)", template)
        assert match, variable
        return set(re.findall(r'"([^"]+)"', match.group(1)))

    def fields(schema: str) -> set[str]:
        return set(spec[f"io.k8s.api.{schema}"]["properties"])

    injection_writes = {"volumes", "initContainers", "containers", "restartPolicy",
                        "terminationGracePeriodSeconds", "shareProcessNamespace"}  # fmt: skip
    assert fields("core.v1.PodSpec") - injection_writes <= listed("podFields")
    assert fields("core.v1.Container") - {"name", "volumeMounts", "livenessProbe"} <= listed(
        "containerFields"
    )
    assert fields("batch.v1.JobSpec") - {"template", "podFailurePolicy"} <= listed("jobFields")
    assert fields("batch.v1.CronJobSpec") - {"jobTemplate"} <= listed("cronJobFields")
    checked = {"capabilities", "privileged", "runAsUser", "runAsGroup", "runAsNonRoot",
               "readOnlyRootFilesystem", "allowPrivilegeEscalation", "seccompProfile"}  # fmt: skip
    assert fields("core.v1.SecurityContext") - checked <= listed("securityNever")


def test_an_operator_started_with_another_sidecar_image_is_refused_with_one_warning(
    api: kubernetes.client.ApiClient,
    controlplane: ControlPlane,
    operator_kubeconfig: Path,
    namespace: str,
    tmp_path: Path,
) -> None:
    """The policy admits only the chart's sidecar image: an operator (or a stolen token)
    injecting another gets 403, and the CronJob one ReconcileError Warning saying so, and
    stays as its user wrote it."""
    rogue = OperatorProcess(
        operator_kubeconfig,
        tmp_path / "operator.log",
        controlplane.env,
        ["--sidecar-image", "registry.example.com/not-cronlock:1"],
    )
    kubernetes.client.BatchV1Api(api).create_namespaced_cron_job(
        namespace, gen.cronjob("report", gen.in_namespace(None), gen.never_due())
    )
    before = comparable(read(api, namespace, "report"))
    rogue.start()
    try:
        [message] = wait_event(api, namespace, "report", "ReconcileError")
        # The rogue injects nothing, so its marker shows it caught up by a refusal too.
        operator_caught_up(
            api,
            lambda client, where, name: any(
                reason == "ReconcileError" for _, reason, _ in events(client, where, name)
            ),
        )

        def one_warning_and_unchanged() -> bool:
            warnings = [r for _, r, _ in events(api, namespace, "report") if r == "ReconcileError"]
            assert len(warnings) == 1, f"{len(warnings)} ReconcileError Events: retried"
            return comparable(read(api, namespace, "report")) == before

        holds(one_warning_and_unchanged, 3, "one warning, the CronJob as its user wrote it")
    finally:
        rogue.stop()
    assert "run only the configured sidecar image" in message
