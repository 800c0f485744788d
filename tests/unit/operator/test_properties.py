"""Injection properties over varied CronJobs: revert undoes it, re-injection changes nothing."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cronlock_operator.injection.build import (
    build_injection,
    desired_cronjob,
    revert,
)
from cronlock_operator.injection.patching import injection_patch, needs_patch
from cronlock_operator.lock.config import InvalidConfig, LockConfig, OperatorSettings, parse_config
from tests.support.cronjobs import (
    NEW_SETTINGS,
    SETTINGS,
    apply_json_patch,
    as_kubernetes_models_see_it,
    make_cronjob,
    pod_spec,
    server_defaults,
)

GRACE_RECORD = "cronlock.io/original-termination-grace-period-seconds"
PROPERTIES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.from_regex(r"[a-z]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
probes = st.sampled_from(
    [
        {"exec": {"command": ["cat", "/tmp/healthy"]}},
        {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 5},
        {"tcpSocket": {"port": "http"}},
    ]
)
user_annotations = st.dictionaries(
    st.sampled_from(["example.com/owner", "kubectl.kubernetes.io/last-applied-configuration"]),
    st.text(max_size=10),
    max_size=2,
)
# Absent, 0, under, equal to and over the kill graces the ttls below give (1s, 6s, 10s).
graces = st.one_of(
    st.none(), st.sampled_from([0, 1, 2, 6, 7, 10, 11, 30, 120]), st.integers(0, 7 * 24 * 3600)
)
labels = st.dictionaries(
    st.sampled_from(["app", "team", "app.kubernetes.io/name"]), names, min_size=1, max_size=2
)


@st.composite
def lock_annotations(draw: st.DrawFn) -> dict[str, str]:
    """cronlock.io/* settings that are valid on their own."""
    annotations = {"cronlock.io/enabled": "true"}
    if draw(st.booleans()):
        annotations["cronlock.io/lock"] = draw(names)
    ttl = draw(st.sampled_from([None, "19s", "30s", "1m", "5m", "1h", "24h"]))
    if ttl is not None:
        annotations["cronlock.io/ttl"] = ttl
        if draw(st.booleans()):
            annotations["cronlock.io/renew"] = draw(st.sampled_from(["1s", "2s", "3500ms"]))
    policy = draw(st.sampled_from([None, "skip", "wait"]))
    if policy is not None:
        annotations["cronlock.io/policy"] = policy
    if policy == "wait" and draw(st.booleans()):
        annotations["cronlock.io/wait-timeout"] = draw(st.sampled_from(["0s", "10s", "1m30s"]))
    stop = draw(st.sampled_from([None, "auto", "liveness", "signal"]))
    if stop is not None:
        annotations["cronlock.io/stop"] = stop
    if draw(st.booleans()):
        annotations["cronlock.io/alert-after"] = str(draw(st.integers(1, 1000)))
    if draw(st.booleans()):
        annotations["cronlock.io/keep-skipped-jobs"] = draw(st.sampled_from(["true", "false"]))
    return annotations


@st.composite
def containers(
    draw: st.DrawFn, container_names: list[str], volumes: list[str]
) -> list[dict[str, Any]]:
    result = []
    for name in container_names:
        container: dict[str, Any] = {"name": name, "image": f"registry.example.com/{name}:1"}
        if draw(st.booleans()):
            container["command"] = ["sh", "-c", draw(st.sampled_from(["true", "sleep 5"]))]
        if draw(st.booleans()):
            container["env"] = [{"name": "MODE", "value": draw(st.sampled_from(["a", "b"]))}]
        if draw(st.booleans()):
            container["ports"] = [{"name": "http", "containerPort": 8080}]
        if draw(st.integers(0, 3)) == 0:
            container["livenessProbe"] = draw(probes)
        mount = draw(st.booleans())
        if volumes and mount:
            mounted = draw(st.sampled_from(volumes))
            container["volumeMounts"] = [{"name": mounted, "mountPath": f"/{mounted}"}]
        if draw(st.integers(0, 3)) == 0:
            container["securityContext"] = {"runAsUser": 1000, "readOnlyRootFilesystem": True}
        result.append(container)
    return result


@st.composite
def cronjobs(draw: st.DrawFn) -> dict[str, Any]:
    """A CronJob as a user would write it, opted in, in many shapes."""
    volume_names = draw(
        st.lists(st.sampled_from(["data", "cache", "config"]), unique=True, max_size=2)
    )
    container_names = draw(
        st.lists(
            st.sampled_from(["main", "worker", "exporter", "proxy"]),
            unique=True,
            min_size=1,
            max_size=3,
        )
    )
    init_names = draw(
        st.lists(st.sampled_from(["setup", "migrate", "log-shipper"]), unique=True, max_size=2)
    )
    restart_policy = draw(st.sampled_from(["OnFailure", "Never"]))
    pod: dict[str, Any] = {}
    if init_names:
        pod["initContainers"] = draw(containers(init_names, volume_names))
        if "log-shipper" in init_names:
            # A user's own native sidecar.
            pod["initContainers"][init_names.index("log-shipper")]["restartPolicy"] = "Always"
    if volume_names:
        pod["volumes"] = [
            {"name": name, "emptyDir": {}}
            if name != "config"
            else {"name": name, "configMap": {"name": "settings"}}
            for name in volume_names
        ]
    if draw(st.booleans()):
        pod["securityContext"] = {"runAsUser": 1000, "runAsNonRoot": True}
    share = draw(st.sampled_from([None, True, False]))
    if share is not None:
        pod["shareProcessNamespace"] = share
    if draw(st.booleans()):
        pod["serviceAccountName"] = "reporter"
    grace = draw(graces)
    if grace is not None:
        pod["terminationGracePeriodSeconds"] = grace

    cronjob = make_cronjob(
        name=draw(names),
        namespace=draw(st.sampled_from(["default", "team-a", "billing"])),
        annotations={**draw(user_annotations), **draw(lock_annotations())},
        restart_policy=restart_policy,
        containers=draw(containers(container_names, volume_names)),
        **pod,
    )
    job_template = cronjob["spec"]["jobTemplate"]
    if draw(st.booleans()):
        job_template["metadata"] = {"labels": draw(labels)}
    if draw(st.booleans()):
        job_template["spec"]["template"]["metadata"] = {"labels": draw(labels)}
    if draw(st.booleans()):
        job_template["spec"]["backoffLimit"] = draw(st.integers(0, 6))
    if restart_policy == "Never" and draw(st.booleans()):
        rules = [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}},
            {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [0, 1]}},
        ]
        job_template["spec"]["podFailurePolicy"] = {
            "rules": draw(st.lists(st.sampled_from(rules), min_size=1, max_size=3))
        }
    return cronjob


def config_or_skip(cronjob: dict[str, Any], operator: OperatorSettings = SETTINGS) -> LockConfig:
    """The CronJob's config; examples whose annotations clash with their pod spec are skipped."""
    try:
        config = parse_config(cronjob, operator)
        build_injection(cronjob, config, operator)
    except InvalidConfig:
        assume(False)
        raise
    return config


@PROPERTIES
@given(cronjobs())
def test_revert_undoes_injection(user: dict[str, Any]) -> None:
    injected = build_injection(user, config_or_skip(user), SETTINGS)
    assert revert(injected) == user
    assert revert(user) == user
    assert as_kubernetes_models_see_it(injected) == injected


@PROPERTIES
@given(cronjobs())
def test_the_pods_grace_never_exceeds_the_kill_grace(user: dict[str, Any]) -> None:
    config = config_or_skip(user)
    injected = build_injection(user, config, SETTINGS)
    users_grace = pod_spec(user).get("terminationGracePeriodSeconds")
    recorded = injected["metadata"]["annotations"].get(GRACE_RECORD)
    assert pod_spec(injected)["terminationGracePeriodSeconds"] <= config.kill_grace_seconds
    if users_grace is None:
        assert recorded == "unset"
    elif users_grace > config.kill_grace_seconds:
        assert recorded == str(users_grace)
    else:
        assert recorded is None
        assert pod_spec(injected)["terminationGracePeriodSeconds"] == users_grace


@PROPERTIES
@given(cronjobs())
def test_injecting_twice_is_injecting_once(user: dict[str, Any]) -> None:
    config = config_or_skip(user)
    injected = build_injection(user, config, SETTINGS)
    assert build_injection(injected, config, SETTINGS) == injected
    assert parse_config(injected, SETTINGS) == config
    assert desired_cronjob(injected, parse_config(injected, SETTINGS), SETTINGS) == injected


@PROPERTIES
@given(cronjobs())
def test_injection_leaves_the_input_alone(user: dict[str, Any]) -> None:
    before = copy.deepcopy(user)
    injected = build_injection(user, config_or_skip(user), SETTINGS)
    assert user == before
    snapshot = copy.deepcopy(injected)
    revert(injected)
    assert injected == snapshot


@PROPERTIES
@given(cronjobs(), lock_annotations())
def test_changed_settings_and_annotations_replace_the_old_injection(
    user: dict[str, Any], new_annotations: dict[str, str]
) -> None:
    injected = build_injection(user, config_or_skip(user), SETTINGS)
    changed_user = copy.deepcopy(user)
    changed_user["metadata"]["annotations"] = new_annotations
    new_config = config_or_skip(changed_user, NEW_SETTINGS)
    changed = copy.deepcopy(injected)
    changed["metadata"]["annotations"] = {
        **{
            key: value
            for key, value in injected["metadata"]["annotations"].items()
            if key.startswith("cronlock.io/original-")
        },
        **new_annotations,
    }
    assert parse_config(changed, NEW_SETTINGS) == new_config
    desired = desired_cronjob(changed, new_config, NEW_SETTINGS)
    assert desired == build_injection(changed_user, new_config, NEW_SETTINGS)


@PROPERTIES
@given(cronjobs())
def test_no_patch_once_the_server_has_stored_the_desired_cronjob(user: dict[str, Any]) -> None:
    injected = build_injection(user, config_or_skip(user), SETTINGS)
    assert not needs_patch(injected, injected)
    stored = server_defaults(injected)
    desired = desired_cronjob(stored, parse_config(stored, SETTINGS), SETTINGS)
    assert not needs_patch(stored, desired)


@PROPERTIES
@given(cronjobs())
def test_patch_injects_and_reverts(user: dict[str, Any]) -> None:
    config = config_or_skip(user)
    stored = server_defaults(user)
    desired = build_injection(stored, config, SETTINGS)
    assert needs_patch(stored, desired)
    patched = apply_json_patch(stored, injection_patch(stored, desired))
    assert patched == desired

    patched["metadata"]["annotations"]["cronlock.io/enabled"] = "false"
    reverted = desired_cronjob(patched, None, SETTINGS)
    assert needs_patch(patched, reverted)
    stored_again = server_defaults(apply_json_patch(patched, injection_patch(patched, reverted)))
    expected = copy.deepcopy(stored)
    expected["metadata"]["annotations"]["cronlock.io/enabled"] = "false"
    assert stored_again == expected
    assert not needs_patch(stored_again, desired_cronjob(stored_again, None, SETTINGS))
