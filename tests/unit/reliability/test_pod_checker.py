"""The pod-mode checker's own logic: what counts as a half-done injection, the fault plan."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from cronlock_operator.config import parse_config
from cronlock_operator.injection import build_injection
from tests.reliability.pods import (
    POD_FAULTS,
    injection_problems,
    plan_faults,
    stale_settings,
)
from tests.unit.operator.cronjobs import SETTINGS, make_cronjob, pod_spec


def injected(**annotations: str) -> dict[str, Any]:
    cronjob = make_cronjob(
        annotations={"cronlock.io/enabled": "true", "cronlock.io/ttl": "13s", **annotations}
    )
    return build_injection(cronjob, parse_config(cronjob, SETTINGS), SETTINGS)


def test_the_operators_own_injection_has_no_problems_and_is_up_to_date() -> None:
    cronjob = injected()
    assert injection_problems(cronjob) == []
    assert stale_settings(cronjob) == []
    assert injection_problems(injected(**{"cronlock.io/lock": "shared"})) == []


def test_a_user_cronjob_is_not_injected() -> None:
    assert injection_problems(make_cronjob(restart_policy="Never")) != []


@pytest.mark.parametrize(
    "corrupt",
    [
        pytest.param(lambda c: pod_spec(c)["initContainers"].pop(1), id="gate missing"),
        pytest.param(
            lambda c: pod_spec(c)["initContainers"].append(
                copy.deepcopy(pod_spec(c)["initContainers"][0])
            ),
            id="sidecar twice",
        ),
        pytest.param(
            lambda c: c["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"].insert(
                0, {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
            ),
            id="our rule not first",
        ),
        pytest.param(
            lambda c: c["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"].append(
                copy.deepcopy(c["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"][0])
            ),
            id="our rule twice",
        ),
        pytest.param(lambda c: pod_spec(c)["volumes"].clear(), id="run-dir volume missing"),
        pytest.param(
            lambda c: pod_spec(c)["containers"][0]["volumeMounts"].clear(), id="mount missing"
        ),
        pytest.param(
            lambda c: pod_spec(c)["containers"][0].pop("livenessProbe"), id="probe missing"
        ),
        pytest.param(
            lambda c: pod_spec(c).update(restartPolicy="OnFailure"), id="restartPolicy kept"
        ),
        pytest.param(
            lambda c: c["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"].clear(),
            id="pod label missing",
        ),
    ],
)
def test_each_half_done_piece_is_a_problem(corrupt: Any) -> None:
    cronjob = injected()
    corrupt(cronjob)
    assert injection_problems(cronjob) != []


def test_a_changed_ttl_is_stale_until_reinjected() -> None:
    cronjob = injected()
    cronjob["metadata"]["annotations"]["cronlock.io/ttl"] = "14s"
    assert stale_settings(cronjob) != []
    assert injection_problems(cronjob) == [], "stale is not half-done"
    assert stale_settings(injected(**{"cronlock.io/ttl": "14s"})) == []


@pytest.mark.parametrize(("trials", "per_trial"), [(4, 2), (7, 1), (14, 2), (3, 3)])
def test_the_plan_spreads_every_fault_kind_evenly(trials: int, per_trial: int) -> None:
    plan = plan_faults(POD_FAULTS, trials, per_trial, random.Random(7))  # noqa: S311
    assert len(plan) == trials
    assert all(len(kinds) == per_trial for kinds in plan)
    counts = [sum(kinds.count(kind) for kinds in plan) for kind in POD_FAULTS]
    assert max(counts) - min(counts) <= 1
    if trials * per_trial >= len(POD_FAULTS):
        assert min(counts) >= 1


def test_no_faults_is_a_plan_of_empty_trials() -> None:
    assert plan_faults([], 3, 2, random.Random(1)) == [[], [], []]  # noqa: S311
