"""Injection writes exactly what DESIGN lists, revert undoes it, and patches only on difference."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from cronlock_operator.cronjob.config import InvalidConfig, LockConfig, parse_config
from cronlock_operator.injection.build import (
    build_injection,
    desired_cronjob,
    is_injected,
    revert,
)
from cronlock_operator.injection.patching import injection_patch, needs_patch
from cronlock_operator.settings import OperatorSettings
from cronlock_sidecar.contract import VERSION
from tests.support import gen
from tests.support.cronjobs import (
    NEW_SETTINGS,
    SETTINGS,
    apply_json_patch,
    as_kubernetes_models_see_it,
    pod_spec,
    server_defaults,
)
from tests.support.paths import ROOT

CASES = Path(__file__).parent / "cases"
GRACE_RECORD = "cronlock.io/original-termination-grace-period-seconds"
ABSENT = object()


def inject(cronjob: dict[str, Any]) -> dict[str, Any]:
    return build_injection(cronjob, parse_config(cronjob, SETTINGS), SETTINGS)


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {
        variable["name"]: variable.get("value", variable.get("valueFrom"))
        for variable in container["env"]
    }


@pytest.mark.parametrize("case", sorted(path.name for path in CASES.iterdir()))
def test_case(case: str) -> None:
    user = yaml.safe_load((CASES / case / "input.yaml").read_text())
    expected = yaml.safe_load((CASES / case / "output.yaml").read_text())
    injected = inject(user)
    assert injected == expected
    assert revert(expected) == user
    assert inject(expected) == expected
    assert not needs_patch(server_defaults(expected), inject(server_defaults(expected)))
    assert as_kubernetes_models_see_it(expected) == expected


def test_injection_shape() -> None:
    user = gen.cronjob(
        "report",
        gen.with_pod(
            initContainers=[{"name": "migrate", "image": "migrate:1"}],
            volumes=[{"name": "data", "emptyDir": {}}],
        ),
    )
    injected = inject(user)
    spec = pod_spec(injected)
    names = [container["name"] for container in spec["initContainers"]]
    assert names == ["cronlock", "cronlock-gate", "migrate"]
    sidecar, gate, migrate = spec["initContainers"]
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["command"] == ["cronlock-sidecar", "hold"]
    assert gate["command"] == ["cronlock-sidecar", "gate"]
    assert "restartPolicy" not in gate
    assert env_of(sidecar) == {
        "CRONLOCK_LEASE": "team-a/cronlock-report",
        "CRONLOCK_TTL": "1m",
        "CRONLOCK_RENEW": "20s",
        "CRONLOCK_POLICY": "skip",
        "CRONLOCK_WAIT_TIMEOUT": "0s",
        "CRONLOCK_STOP": "liveness",
        "CRONLOCK_KILL_GRACE": "10s",
        "CRONLOCK_SKEW": "2s",
        "CRONLOCK_PORT": "8484",
        "CRONLOCK_RUN_DIR": "/var/run/cronlock",
        "CRONLOCK_OPERATOR_VERSION": VERSION,
        "CRONLOCK_POD_NAME": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
        "CRONLOCK_POD_UID": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.uid"}},
        "CRONLOCK_POD_NAMESPACE": {
            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}
        },
        "CRONLOCK_JOB_NAME": {
            "fieldRef": {
                "apiVersion": "v1",
                "fieldPath": "metadata.labels['batch.kubernetes.io/job-name']",
            }
        },
        # Each tick at most once: whose ticks the Job works, and which Job's run it is.
        "CRONLOCK_CRONJOB": "report",
        "CRONLOCK_JOB_UID": {
            "fieldRef": {
                "apiVersion": "v1",
                "fieldPath": "metadata.labels['batch.kubernetes.io/controller-uid']",
            }
        },
    }
    assert env_of(gate) == {"CRONLOCK_RUN_DIR": "/var/run/cronlock", "CRONLOCK_WAIT_TIMEOUT": "0s"}
    for ours in (sidecar, gate):
        assert ours["securityContext"] == {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        assert ours["resources"] == {
            "requests": {"cpu": "10m", "memory": "32Mi"},
            "limits": {"memory": "64Mi"},
        }
        assert ours["volumeMounts"] == [{"name": "cronlock", "mountPath": "/var/run/cronlock"}]
    read_only = {"name": "cronlock", "mountPath": "/var/run/cronlock", "readOnly": True}
    assert migrate["volumeMounts"] == [read_only]
    assert spec["containers"][0]["volumeMounts"] == [read_only]
    assert spec["containers"][0]["livenessProbe"] == {
        "httpGet": {"path": "/held", "port": 8484},
        "periodSeconds": 1,
        # The default ttl (60s) has room for a probe that forgives one slow answer.
        "failureThreshold": 2,
        "timeoutSeconds": 3,
        "terminationGracePeriodSeconds": 10,
    }
    assert spec["volumes"] == [
        {"name": "data", "emptyDir": {}},
        {"name": "cronlock", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
    ]
    assert spec["restartPolicy"] == "Never"
    assert spec["terminationGracePeriodSeconds"] == 10
    job_template = injected["spec"]["jobTemplate"]
    assert job_template["metadata"]["labels"] == {"cronlock.io/lock": "report"}
    assert job_template["spec"]["template"]["metadata"]["labels"] == {"cronlock.io/lock": "report"}
    assert job_template["spec"]["podFailurePolicy"] == {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": "cronlock-gate", "operator": "In", "values": [75]},
            }
        ]
    }
    assert injected["metadata"]["annotations"] == {
        "cronlock.io/enabled": "true",
        "cronlock.io/original-restart-policy": "OnFailure",
        "cronlock.io/original-termination-grace-period-seconds": "unset",
    }
    assert "shareProcessNamespace" not in spec
    assert revert(injected) == user


def test_injection_leaves_its_argument_alone() -> None:
    user = gen.cronjob("report")
    before = copy.deepcopy(user)
    injected = inject(user)
    assert user == before
    revert(injected)
    desired_cronjob(injected, None, SETTINGS)
    assert inject(user) == injected


def test_never_restart_policy_and_a_grace_within_the_kill_grace_record_nothing() -> None:
    user = gen.cronjob(
        "report", gen.restart_policy("Never"), gen.with_pod(terminationGracePeriodSeconds=10)
    )
    injected = inject(user)
    assert injected["metadata"]["annotations"] == {"cronlock.io/enabled": "true"}
    assert pod_spec(injected)["terminationGracePeriodSeconds"] == 10
    assert revert(injected) == user


@pytest.mark.parametrize("stop", ["liveness", "signal"])
@pytest.mark.parametrize(
    ("ttl", "users_grace", "pod_grace", "recorded"),
    [
        ("1m", ABSENT, 10, "unset"),
        ("1m", 30, 10, "30"),
        ("1m", 120, 10, "120"),
        ("1m", 11, 10, "11"),
        ("1m", 10, 10, None),
        ("1m", 3, 3, None),
        ("1m", 0, 0, None),
        ("30s", 30, 5, "30"),
        ("30s", 6, 5, "6"),
        ("30s", 5, 5, None),
        ("19s", 30, 2, "30"),
    ],
)
def test_the_pods_grace_is_capped_at_the_kill_grace(
    stop: str, ttl: str, users_grace: object, pod_grace: int, recorded: str | None
) -> None:
    """A liveness failure with restartPolicy Never kills the whole pod with the pod's grace."""
    extra = {} if users_grace is ABSENT else {"terminationGracePeriodSeconds": users_grace}
    user = gen.cronjob(
        "report",
        gen.restart_policy("Never"),
        gen.annotated({"cronlock.io/ttl": ttl, "cronlock.io/stop": stop}),
        gen.with_pod(shareProcessNamespace=True, **extra),
    )
    config = parse_config(user, SETTINGS)
    injected = inject(user)
    assert pod_spec(injected)["terminationGracePeriodSeconds"] == pod_grace
    assert pod_grace <= config.kill_grace_seconds
    assert injected["metadata"]["annotations"].get(GRACE_RECORD) == recorded
    assert revert(injected) == user
    assert inject(injected) == injected
    assert not needs_patch(server_defaults(injected), inject(server_defaults(injected)))


@pytest.mark.parametrize("odd", ["30", 30.0, 12.5, None, True, [30], {"seconds": 30}])
def test_a_grace_that_is_not_a_whole_number_is_left_to_the_api_server(odd: object) -> None:
    user = gen.cronjob(
        "report", gen.restart_policy("Never"), gen.with_pod(terminationGracePeriodSeconds=odd)
    )
    injected = inject(user)
    assert pod_spec(injected)["terminationGracePeriodSeconds"] == odd
    assert GRACE_RECORD not in injected["metadata"]["annotations"]
    assert revert(injected) == user
    assert inject(injected) == injected


def test_the_grace_the_api_server_defaulted_is_recorded_and_put_back() -> None:
    stored = server_defaults(gen.cronjob("report", gen.restart_policy("Never")))
    assert pod_spec(stored)["terminationGracePeriodSeconds"] == 30
    desired = inject(stored)
    assert pod_spec(desired)["terminationGracePeriodSeconds"] == 10
    assert desired["metadata"]["annotations"][GRACE_RECORD] == "30"
    patched = server_defaults(apply_json_patch(stored, injection_patch(stored, desired)))
    assert not needs_patch(
        patched, desired_cronjob(patched, parse_config(patched, SETTINGS), SETTINGS)
    )
    patched["metadata"]["annotations"]["cronlock.io/enabled"] = "false"
    reverted = desired_cronjob(patched, None, SETTINGS)
    assert pod_spec(reverted)["terminationGracePeriodSeconds"] == 30
    assert GRACE_RECORD not in reverted["metadata"]["annotations"]


def test_a_new_ttl_recaps_the_grace_and_keeps_the_users_original() -> None:
    user = gen.cronjob(
        "report",
        gen.annotated({"cronlock.io/ttl": "30s"}),
        gen.with_pod(terminationGracePeriodSeconds=8),
    )
    short = inject(user)
    assert pod_spec(short)["terminationGracePeriodSeconds"] == 5
    assert short["metadata"]["annotations"][GRACE_RECORD] == "8"
    short["metadata"]["annotations"]["cronlock.io/ttl"] = "1m"
    longer = desired_cronjob(short, parse_config(short, SETTINGS), SETTINGS)
    assert pod_spec(longer)["terminationGracePeriodSeconds"] == 8
    assert GRACE_RECORD not in longer["metadata"]["annotations"]
    user["metadata"]["annotations"]["cronlock.io/ttl"] = "1m"
    assert longer == inject(user)
    assert revert(longer) == user


@pytest.mark.parametrize("record", ["", "ten", "-5", "1.5", " 30", "9" * 5000])
def test_a_grace_record_cronlock_never_writes_is_refused_not_guessed(record: str) -> None:
    injected = inject(gen.cronjob("report"))
    injected["metadata"]["annotations"][GRACE_RECORD] = record
    before = copy.deepcopy(injected)
    for config in (None, parse_config(injected, SETTINGS)):
        with pytest.raises(InvalidConfig) as caught:
            desired_cronjob(injected, config, SETTINGS)
        assert caught.value.annotation == GRACE_RECORD
        assert "terminationGracePeriodSeconds" in str(caught.value)
    assert injected == before


FORGED_RECORDS = {
    "cronlock.io/original-restart-policy": "OnFailure",
    "cronlock.io/original-share-process-namespace": "false",
    GRACE_RECORD: "unset",
}


def test_original_annotations_on_a_never_injected_cronjob_change_nothing() -> None:
    """Issue 13: only cronlock's own record of an injection may rewrite the pod spec."""
    user = gen.cronjob(
        "report",
        gen.restart_policy("Never"),
        gen.with_annotations({"cronlock.io/enabled": "false", **FORGED_RECORDS}),
        gen.with_pod(shareProcessNamespace=True, terminationGracePeriodSeconds=45),
    )
    assert not is_injected(user)
    assert revert(user) == user
    assert desired_cronjob(user, None, SETTINGS) == user
    assert not needs_patch(user, desired_cronjob(user, None, SETTINGS))


def test_a_half_removed_injection_is_still_reverted_through_its_skip_rule() -> None:
    """Someone took out cronlock's containers; its podFailurePolicy rule still marks it."""
    user = gen.cronjob("report", gen.with_pod(terminationGracePeriodSeconds=120))
    half = inject(user)
    del pod_spec(half)["initContainers"]
    assert not is_injected(half)
    reverted = revert(half)
    assert pod_spec(reverted)["restartPolicy"] == "OnFailure"
    assert pod_spec(reverted)["terminationGracePeriodSeconds"] == 120
    assert reverted["metadata"]["annotations"] == {"cronlock.io/enabled": "true"}
    assert "podFailurePolicy" not in reverted["spec"]["jobTemplate"]["spec"]


def test_records_without_any_trace_of_injection_are_left_alone() -> None:
    """Containers and skip rule both gone: the records are no longer evidence of anything."""
    half = inject(gen.cronjob("report", gen.with_pod(terminationGracePeriodSeconds=120)))
    del pod_spec(half)["initContainers"]
    del half["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]
    assert revert(half) == half


def test_user_pod_failure_rules_come_after_ours_and_survive_revert() -> None:
    user = gen.cronjob("report", gen.restart_policy("Never"))
    user_rules = [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
    user["spec"]["jobTemplate"]["spec"]["podFailurePolicy"] = {"rules": user_rules}
    injected = inject(user)
    rules = injected["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"]
    assert rules[0]["onExitCodes"]["containerName"] == "cronlock-gate"
    assert rules[1:] == user_rules
    assert revert(injected) == user


def test_signal_runs_the_sidecar_as_the_users_uid() -> None:
    user = gen.cronjob(
        "report",
        gen.annotated({"cronlock.io/stop": "signal"}),
        gen.containers({"name": "main", "image": "app", "securityContext": {"runAsUser": 4242}}),
    )
    injected = inject(user)
    spec = pod_spec(injected)
    assert spec["shareProcessNamespace"] is True
    assert spec["initContainers"][0]["securityContext"]["runAsUser"] == 4242
    assert spec["initContainers"][1]["securityContext"]["runAsUser"] == 65532
    assert "livenessProbe" not in spec["containers"][0]
    assert (
        injected["metadata"]["annotations"]["cronlock.io/original-share-process-namespace"]
        == "unset"
    )
    assert revert(injected) == user


def test_signal_keeps_a_users_own_share_process_namespace() -> None:
    user = gen.cronjob(
        "report",
        gen.annotated({"cronlock.io/stop": "signal"}),
        gen.with_pod(shareProcessNamespace=True),
    )
    injected = inject(user)
    assert "cronlock.io/original-share-process-namespace" not in injected["metadata"]["annotations"]
    assert revert(injected) == user


def test_changing_stop_from_liveness_to_signal_moves_the_wiring() -> None:
    user = gen.cronjob("report")
    liveness = inject(user)
    user_signal = copy.deepcopy(user)
    user_signal["metadata"]["annotations"]["cronlock.io/stop"] = "signal"
    liveness["metadata"]["annotations"]["cronlock.io/stop"] = "signal"
    config = parse_config(liveness, SETTINGS)
    assert config.stop == "signal"
    assert desired_cronjob(liveness, config, SETTINGS) == inject(user_signal)


def test_disabling_reverts_to_what_the_user_wrote() -> None:
    user = gen.cronjob("report")
    injected = inject(user)
    injected["metadata"]["annotations"]["cronlock.io/enabled"] = "false"
    expected = copy.deepcopy(user)
    expected["metadata"]["annotations"]["cronlock.io/enabled"] = "false"
    assert desired_cronjob(injected, None, SETTINGS) == expected
    assert needs_patch(injected, expected)


def test_revert_keeps_a_never_injected_cronjobs_own_cronlock_container() -> None:
    user = gen.cronjob(
        "report",
        gen.not_opted_in(),
        gen.with_pod(initContainers=[{"name": "cronlock", "image": "mine", "command": ["./lock"]}]),
    )
    assert not is_injected(user)
    assert revert(user) == user


def test_kubectl_apply_of_the_original_is_put_right() -> None:
    """Re-applying the user's manifest resets restartPolicy and reorders init containers."""
    user = gen.cronjob(
        "report", gen.with_pod(initContainers=[{"name": "migrate", "image": "migrate:1"}])
    )
    injected = inject(user)
    applied = copy.deepcopy(injected)
    spec = pod_spec(applied)
    spec["restartPolicy"] = "OnFailure"
    spec["initContainers"] = spec["initContainers"][2:] + spec["initContainers"][:2]
    assert needs_patch(applied, inject(applied))
    assert inject(applied) == injected


def test_desired_with_new_settings_replaces_the_old_injection() -> None:
    user = gen.cronjob("report")
    old = inject(user)
    config = parse_config(old, NEW_SETTINGS)
    desired = desired_cronjob(old, config, NEW_SETTINGS)
    assert desired == build_injection(user, parse_config(user, NEW_SETTINGS), NEW_SETTINGS)
    assert pod_spec(desired)["initContainers"][0]["image"] == "ghcr.io/example/cronlock:1.1.0"
    assert needs_patch(old, desired)


def test_server_defaults_in_our_pieces_do_not_cause_a_patch() -> None:
    user = gen.cronjob("report", gen.annotated({"cronlock.io/lock": "x"}))
    stored = server_defaults(inject(server_defaults(user)))
    desired = desired_cronjob(stored, parse_config(stored, SETTINGS), SETTINGS)
    assert desired != stored
    assert not needs_patch(stored, desired)


def test_a_changed_value_inside_our_pieces_is_a_difference() -> None:
    stored = server_defaults(inject(gen.cronjob("report")))
    desired = inject(stored)
    tampered = copy.deepcopy(stored)
    pod_spec(tampered)["containers"][0]["livenessProbe"]["periodSeconds"] = 30
    assert needs_patch(tampered, desired)
    tampered = copy.deepcopy(stored)
    pod_spec(tampered)["initContainers"][0]["env"].pop()
    assert needs_patch(tampered, desired)
    tampered = copy.deepcopy(stored)
    tampered["metadata"]["annotations"].pop("cronlock.io/original-restart-policy")
    assert needs_patch(tampered, desired)


def test_patch_turns_the_stored_cronjob_into_the_desired_one() -> None:
    written = gen.cronjob("report")
    written["metadata"]["resourceVersion"] = "1"
    stored = server_defaults(written)
    desired = inject(stored)
    patch = injection_patch(stored, desired)
    assert patch[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "1"}
    assert patch[1]["op"] == "replace"
    assert patch[1]["path"] == "/spec/jobTemplate"
    assert patch[2:] == [
        {
            "op": "add",
            "path": "/metadata/annotations/cronlock.io~1original-restart-policy",
            "value": "OnFailure",
        },
        {
            "op": "add",
            "path": "/metadata/annotations/cronlock.io~1original-termination-grace-period-seconds",
            "value": "30",
        },
    ]
    patched = apply_json_patch(stored, patch)
    assert patched == desired
    assert not needs_patch(server_defaults(patched), inject(server_defaults(patched)))

    disabled = copy.deepcopy(patched)
    disabled["metadata"]["annotations"]["cronlock.io/enabled"] = "false"
    reverted = desired_cronjob(disabled, None, SETTINGS)
    assert apply_json_patch(disabled, injection_patch(disabled, reverted)) == reverted


def test_patch_adds_the_annotations_map_when_there_is_none() -> None:
    stored = gen.cronjob("report")
    config = parse_config(stored, SETTINGS)
    del stored["metadata"]["annotations"]
    desired = build_injection(stored, config, SETTINGS)
    patch = injection_patch(stored, desired)
    assert patch[-1] == {
        "op": "add",
        "path": "/metadata/annotations",
        "value": {
            "cronlock.io/original-restart-policy": "OnFailure",
            "cronlock.io/original-termination-grace-period-seconds": "unset",
        },
    }
    assert apply_json_patch(stored, patch) == desired


def test_a_lost_race_fails_the_patch() -> None:
    stored = server_defaults(gen.cronjob("report"))
    patch = injection_patch(stored, inject(stored))
    moved_on = copy.deepcopy(stored)
    moved_on["metadata"]["resourceVersion"] = "2"
    with pytest.raises(ValueError, match="test failed"):
        apply_json_patch(moved_on, patch)


def with_pod(**changes: Any) -> dict[str, Any]:
    cronjob = gen.cronjob("report")
    pod_spec(cronjob).update(changes)
    return cronjob


def signal(cronjob: dict[str, Any]) -> dict[str, Any]:
    cronjob["metadata"]["annotations"]["cronlock.io/stop"] = "signal"
    return cronjob


def with_rules(count: int) -> dict[str, Any]:
    cronjob = gen.cronjob("report", gen.restart_policy("Never"))
    rule = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    cronjob["spec"]["jobTemplate"]["spec"]["podFailurePolicy"] = {"rules": [rule] * count}
    return cronjob


def with_template_label() -> dict[str, Any]:
    cronjob = gen.cronjob("report")
    cronjob["spec"]["jobTemplate"]["metadata"] = {"labels": {"cronlock.io/lock": "mine"}}
    return cronjob


UNINJECTABLE = [
    ("container-named-cronlock", with_pod(containers=[{"name": "cronlock", "image": "x"}])),
    (
        "init-container-named-cronlock-gate",
        with_pod(initContainers=[{"name": "cronlock-gate", "image": "x"}]),
    ),
    ("volume-named-cronlock", with_pod(volumes=[{"name": "cronlock", "emptyDir": {}}])),
    ("restart-policy-always", with_pod(restartPolicy="Always")),
    ("no-containers", with_pod(containers=[])),
    (
        "port-8484",
        with_pod(containers=[{"name": "web", "image": "x", "ports": [{"containerPort": 8484}]}]),
    ),
    (
        "mount-at-run-dir",
        with_pod(
            containers=[
                {
                    "name": "main",
                    "image": "x",
                    "volumeMounts": [{"name": "data", "mountPath": "/var/run/cronlock/"}],
                }
            ],
            volumes=[{"name": "data", "emptyDir": {}}],
        ),
    ),
    (
        "own-probe-on-sidecar-port",
        with_pod(
            containers=[
                {
                    "name": "main",
                    "image": "x",
                    "livenessProbe": {"httpGet": {"path": "/held", "port": 8484}},
                }
            ]
        ),
    ),
    ("twenty-pod-failure-rules", with_rules(20)),
    ("lock-label-already-set", with_template_label()),
]


@pytest.mark.parametrize(("name", "cronjob"), UNINJECTABLE, ids=[case[0] for case in UNINJECTABLE])
def test_uninjectable_template_is_refused_before_anything_is_built(
    name: str, cronjob: dict[str, Any]
) -> None:
    before = copy.deepcopy(cronjob)
    config = parse_config(cronjob, SETTINGS)
    with pytest.raises(InvalidConfig) as caught:
        desired_cronjob(cronjob, config, SETTINGS)
    assert caught.value.annotation == "cronlock.io/enabled"
    assert "cannot be applied" in str(caught.value)
    assert cronjob == before


def test_nineteen_pod_failure_rules_still_fit() -> None:
    injected = inject(with_rules(19))
    assert len(injected["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"]) == 20


@pytest.mark.parametrize(
    ("cronjob", "words"),
    [
        (
            signal(
                gen.cronjob(
                    "report",
                    gen.containers(
                        {"name": "a", "image": "x", "securityContext": {"runAsUser": 1000}},
                        {"name": "b", "image": "x", "securityContext": {"runAsUser": 2000}},
                    ),
                )
            ),
            "different users",
        ),
        (signal(with_pod(securityContext={"runAsUser": 0})), "root"),
    ],
    ids=["two-uids", "root"],
)
def test_signal_that_could_not_reach_the_processes_is_refused(
    cronjob: dict[str, Any], words: str
) -> None:
    config = parse_config(cronjob, SETTINGS)
    assert config.stop == "signal"
    with pytest.raises(InvalidConfig) as caught:
        build_injection(cronjob, config, SETTINGS)
    assert caught.value.annotation == "cronlock.io/stop"
    assert words in str(caught.value)


def test_a_cronjob_without_namespace_is_a_programming_error() -> None:
    cronjob = gen.cronjob("report")
    del cronjob["metadata"]["namespace"]
    config: LockConfig = parse_config(cronjob, SETTINGS)
    with pytest.raises(ValueError, match="namespace"):
        build_injection(cronjob, config, SETTINGS)


@pytest.mark.parametrize(
    ("job_spec", "said"),
    [
        ({"parallelism": 2}, "parallelism is 2"),
        ({"completions": 3}, "completions is 3"),
        ({"completionMode": "Indexed"}, "completionMode is Indexed"),
    ],
)
def test_a_job_of_more_than_one_pod_is_refused(job_spec: dict[str, Any], said: str) -> None:
    """Two pods of one Job would take the Lease from each other (security review N13)."""
    cronjob = gen.cronjob("report")
    cronjob["spec"]["jobTemplate"]["spec"].update(job_spec)
    with pytest.raises(InvalidConfig, match=said):
        build_injection(cronjob, parse_config(cronjob, SETTINGS), SETTINGS)


def test_a_pod_without_its_token_is_refused() -> None:
    cronjob = gen.cronjob("report")
    cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["automountServiceAccountToken"] = (
        False
    )
    with pytest.raises(InvalidConfig, match="automountServiceAccountToken: false"):
        build_injection(cronjob, parse_config(cronjob, SETTINGS), SETTINGS)


def test_signal_runs_the_sidecar_as_the_uid_the_work_really_has() -> None:
    """Pod-level root overridden by the container: the sidecar takes the container's 1000,
    not the old `0 or 65532` (security review N13)."""
    cronjob = gen.cronjob("report", gen.annotated({"cronlock.io/stop": "signal"}))
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    pod["securityContext"] = {"runAsUser": 0}
    pod["containers"][0]["securityContext"] = {"runAsUser": 1000}
    injected = build_injection(cronjob, parse_config(cronjob, SETTINGS), SETTINGS)
    sidecar = injected["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"][0]
    assert sidecar["securityContext"]["runAsUser"] == 1000


STORES = OperatorSettings(
    sidecar_image="ghcr.io/example/cronlock:1.0.0",
    sidecar_stores_image="ghcr.io/example/cronlock-stores:1.0.0",
)
IN_POSTGRES = {
    "cronlock.io/enabled": "true",
    "cronlock.io/store": "postgres",
    "cronlock.io/store-secret": "team-locks",
}


def test_a_lock_in_a_store_mounts_its_secret_into_the_sidecar_alone() -> None:
    user = gen.cronjob("report", gen.with_annotations(IN_POSTGRES))
    injected = build_injection(user, parse_config(user, STORES), STORES)
    spec = pod_spec(injected)
    sidecar, gate = spec["initContainers"]
    assert (sidecar["image"], gate["image"]) == (
        "ghcr.io/example/cronlock-stores:1.0.0",
        "ghcr.io/example/cronlock:1.0.0",
    )
    env = env_of(sidecar)
    assert env["CRONLOCK_STORE_FILE"] == "/var/run/cronlock-store/url"
    assert env["CRONLOCK_STORE_KIND"] == "postgres"
    assert {
        "name": "cronlock-store",
        "mountPath": "/var/run/cronlock-store",
        "readOnly": True,
    } in sidecar["volumeMounts"]
    for container in [gate, *spec["containers"]]:
        assert "cronlock-store" not in [m["name"] for m in container.get("volumeMounts", [])]
        assert "CRONLOCK_STORE_FILE" not in [e["name"] for e in container.get("env", [])]
    assert spec["volumes"][-2] == {
        "name": "cronlock-store",
        "secret": {"secretName": "team-locks", "items": [{"key": "url", "path": "url"}]},
    }
    # The API server's defaults (defaultMode 420) are no difference; revert takes it all out.
    stored = server_defaults(injected)
    stored_spec = pod_spec(stored)
    stored_spec["volumes"][-2]["secret"]["defaultMode"] = 420
    assert not needs_patch(stored, build_injection(stored, parse_config(stored, STORES), STORES))
    assert revert(injected) == user


def test_a_lock_in_a_store_of_n_permits_tells_its_sidecar_n() -> None:
    """No operator writes N on a store's document: the sidecar's claim does, from
    CRONLOCK_PERMITS (docs/DECISIONS.md, "Permits in a store"). On a Lease, and for one
    permit, the sidecar is told nothing: the document's N is the lock's."""
    shared = gen.cronjob(
        "report", gen.with_annotations({**IN_POSTGRES, "cronlock.io/permits": "3"})
    )
    sidecar = pod_spec(build_injection(shared, parse_config(shared, STORES), STORES))[
        "initContainers"
    ][0]
    assert env_of(sidecar)["CRONLOCK_PERMITS"] == "3"
    for said in (
        IN_POSTGRES,
        {"cronlock.io/enabled": "true", "cronlock.io/permits": "3"},
    ):
        user = gen.cronjob("report", gen.with_annotations(said))
        sidecar = pod_spec(build_injection(user, parse_config(user, STORES), STORES))[
            "initContainers"
        ][0]
        assert "CRONLOCK_PERMITS" not in env_of(sidecar)


def test_a_lock_in_a_store_needs_no_service_account_token() -> None:
    """The sidecar talks to Redis or PostgreSQL, not the API server."""
    user = gen.cronjob(
        "report",
        gen.with_annotations(IN_POSTGRES),
        gen.with_pod(automountServiceAccountToken=False),
    )
    build_injection(user, parse_config(user, STORES), STORES)
    with pytest.raises(InvalidConfig, match="automountServiceAccountToken: false"):
        inject(gen.cronjob("report", gen.with_pod(automountServiceAccountToken=False)))


def test_the_store_volume_name_is_reserved() -> None:
    user = gen.cronjob("report", gen.with_pod(volumes=[{"name": "cronlock-store", "emptyDir": {}}]))
    with pytest.raises(InvalidConfig, match="the volume name cronlock-store is reserved"):
        inject(user)


def test_a_cronjob_injected_with_the_old_strict_probe_is_brought_to_the_new_one() -> None:
    # Before the probe's tolerance came from the ttl, every CronJob had 1 s x 1; at the
    # default ttl the operator now wants 3 s x 2, and patches a stored old injection to it.
    stored = server_defaults(inject(gen.cronjob("report")))
    old = copy.deepcopy(stored)
    probe = pod_spec(old)["containers"][0]["livenessProbe"]
    probe["timeoutSeconds"], probe["failureThreshold"] = 1, 1
    desired = desired_cronjob(old, parse_config(old, SETTINGS), SETTINGS)
    assert needs_patch(old, desired)
    patched = server_defaults(apply_json_patch(old, injection_patch(old, desired)))
    probe = pod_spec(patched)["containers"][0]["livenessProbe"]
    assert (probe["timeoutSeconds"], probe["failureThreshold"]) == (3, 2)
    assert not needs_patch(
        patched, desired_cronjob(patched, parse_config(patched, SETTINGS), SETTINGS)
    )


@pytest.mark.parametrize(
    ("stop", "probe", "said"),
    [
        ("signal", False, 'cronlock.io/stop: "signal" cannot be used with cronlock.io/store: '),
        ("auto", True, 'cronlock.io/stop: "auto" resolves to signal, since container(s) work'),
    ],
    ids=["signal", "auto-resolving-to-signal"],
)
def test_signal_with_a_store_is_refused_for_the_url_under_proc(
    stop: str, probe: bool, said: str
) -> None:
    """Under stop: signal the work shares the sidecar's PID namespace and UID, so it could
    read /proc/<sidecar pid>/root/var/run/cronlock-store/url (security review H1)."""
    containers = [{"name": "work", "image": "busybox:1.37"}]
    if probe:
        containers[0]["livenessProbe"] = {"exec": {"command": ["true"]}}
    user = gen.cronjob(
        "report",
        gen.with_annotations({**IN_POSTGRES, "cronlock.io/stop": stop}),
        gen.containers(*containers),
    )
    with pytest.raises(InvalidConfig) as caught:
        parse_config(user, STORES)
    assert caught.value.annotation == "cronlock.io/stop"
    message = str(caught.value)
    assert said in message
    assert "/proc/<sidecar pid>/root" in message
    assert 'set cronlock.io/stop: "liveness"' in message
    # The same CronJob on the Lease, or with liveness, is still guarded.
    lease = gen.cronjob(
        "report", gen.annotated({"cronlock.io/stop": stop}), gen.containers(*containers)
    )
    assert parse_config(lease, STORES).stop == "signal"
    liveness = gen.cronjob(
        "report", gen.with_annotations({**IN_POSTGRES, "cronlock.io/stop": "liveness"})
    )
    assert parse_config(liveness, STORES).stop == "liveness"


def test_a_store_in_a_pod_that_shares_its_processes_is_refused() -> None:
    """Security review L-N12: with the pod's own shareProcessNamespace: true, work running as
    the sidecar's user (65532, distroless's "nonroot") could read the store's URL through
    /proc/<sidecar pid>/root, whatever the stop method. Refused with a store; the same pod on
    the Lease is guarded; an "original" annotation written by hand exempts nothing."""
    shared = gen.cronjob(
        "report", gen.with_annotations(dict(IN_POSTGRES)), gen.with_pod(shareProcessNamespace=True)
    )
    with pytest.raises(InvalidConfig) as caught:
        parse_config(shared, STORES)
    assert caught.value.annotation == "cronlock.io/store"
    assert "shareProcessNamespace: true" in str(caught.value)
    assert "/proc/<sidecar pid>/root" in str(caught.value)
    on_the_lease = gen.cronjob("report", gen.with_pod(shareProcessNamespace=True))
    assert parse_config(on_the_lease, STORES).store == "lease"
    claimed_original = gen.cronjob(
        "report",
        gen.with_annotations(
            {**IN_POSTGRES, "cronlock.io/original-share-process-namespace": "unset"}
        ),
        gen.with_pod(shareProcessNamespace=True),
    )
    with pytest.raises(InvalidConfig):
        parse_config(claimed_original, STORES)
    assert (
        parse_config(gen.cronjob("report", gen.with_annotations(dict(IN_POSTGRES))), STORES).store
        == "postgres"
    )


def test_the_operator_scope_policy_admits_every_variable_the_injection_writes() -> None:
    """The chart's scope policy lists the variables cronlock's containers may carry; one the
    injection writes and the list lacks would refuse every injection on a cluster."""
    policy = (ROOT / "charts" / "cronlock" / "templates" / "_scope-policy.tpl").read_text()
    listed = policy.split("- name: injectedEnv", 1)[1].split("- name:", 1)[0]
    allowed = set(re.findall(r'"(CRONLOCK_[A-Z_]+)"', listed))
    written = set()
    for case in CASES.iterdir():
        output = yaml.safe_load((case / "output.yaml").read_text())
        pod = output["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        for container in pod["initContainers"]:
            if container["name"] in ("cronlock", "cronlock-gate"):
                written |= {item["name"] for item in container.get("env") or []}
    assert "CRONLOCK_OPERATOR_VERSION" in written
    assert written <= allowed, written - allowed


def test_a_lock_in_a_store_gives_the_work_a_volume_to_say_its_tick_succeeded() -> None:
    """Issue 56: a pod's sidecar does not learn its work's exit code, so on a store lock the
    work creates /var/run/cronlock-success/succeeded, in an emptyDir writable by the work's
    containers alone and read-only in the sidecar; a Lease lock gets none (the operator
    records a tick's success there when the Job completes)."""
    user = gen.cronjob("report", gen.with_annotations(IN_POSTGRES))
    injected = build_injection(user, parse_config(user, STORES), STORES)
    spec = pod_spec(injected)
    sidecar, gate = spec["initContainers"]
    assert spec["volumes"][-1] == {
        "name": "cronlock-success",
        "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"},
    }
    assert {
        "name": "cronlock-success",
        "mountPath": "/var/run/cronlock-success",
        "readOnly": True,
    } in sidecar["volumeMounts"]
    assert "cronlock-success" not in [m["name"] for m in gate["volumeMounts"]]
    for container in spec["containers"]:
        assert {
            "name": "cronlock-success",
            "mountPath": "/var/run/cronlock-success",
        } in container["volumeMounts"]
    assert revert(injected) == user
    on_lease = gen.cronjob("report", gen.with_annotations({"cronlock.io/enabled": "true"}))
    lease_spec = pod_spec(build_injection(on_lease, parse_config(on_lease, STORES), STORES))
    mounted = [
        mount["name"]
        for container in [*lease_spec["initContainers"], *lease_spec["containers"]]
        for mount in container.get("volumeMounts", [])
    ]
    assert "cronlock-success" not in mounted
    assert "cronlock-success" not in [volume["name"] for volume in lease_spec["volumes"]]


def test_a_store_locks_work_that_mounts_the_success_directory_itself_is_refused() -> None:
    user = gen.cronjob("report", gen.with_annotations(IN_POSTGRES))
    pod_spec(user)["containers"][0]["volumeMounts"] = [
        {"name": "scratch", "mountPath": "/var/run/cronlock-success/"}
    ]
    pod_spec(user)["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    with pytest.raises(InvalidConfig, match="mounts a volume at /var/run/cronlock-success,"):
        build_injection(user, parse_config(user, STORES), STORES)
    # On a Lease the directory is not cronlock's: the user's mount there stays.
    on_lease = gen.cronjob("report", gen.with_annotations({"cronlock.io/enabled": "true"}))
    pod_spec(on_lease)["containers"][0]["volumeMounts"] = [
        {"name": "scratch", "mountPath": "/var/run/cronlock-success"}
    ]
    pod_spec(on_lease)["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    build_injection(on_lease, parse_config(on_lease, STORES), STORES)
    named = gen.cronjob("report", gen.with_annotations(IN_POSTGRES))
    pod_spec(named)["volumes"] = [{"name": "cronlock-success", "emptyDir": {}}]
    with pytest.raises(InvalidConfig, match="volume name cronlock-success is reserved"):
        build_injection(named, parse_config(named, STORES), STORES)
