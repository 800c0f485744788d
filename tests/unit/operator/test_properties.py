"""Injection properties over varied CronJobs: revert undoes it, re-injection changes nothing."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, assume, given, settings

from cronlock_operator.cronjob.config import InvalidConfig, LockConfig, parse_config
from cronlock_operator.injection.build import (
    build_injection,
    desired_cronjob,
    revert,
)
from cronlock_operator.injection.patching import injection_patch, needs_patch
from cronlock_operator.settings import OperatorSettings
from tests.support.cronjobs import (
    NEW_SETTINGS,
    SETTINGS,
    apply_json_patch,
    as_kubernetes_models_see_it,
    pod_spec,
    server_defaults,
)
from tests.support.strategies import cronjobs, lock_annotations

GRACE_RECORD = "cronlock.io/original-termination-grace-period-seconds"
PROPERTIES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


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
