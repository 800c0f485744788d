"""What the injected sidecar learns for each tick at most once: whose ticks its Job works,
the Job's uid, and the cluster's name (the operator's --cluster-name, chart clusterName)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from cronlock_operator.cli import parse_args, settings_from
from cronlock_operator.cronjob.config import parse_config
from cronlock_operator.injection.build import build_injection, revert
from cronlock_operator.settings import OperatorSettings
from tests.support import gen
from tests.support.cronjobs import SETTINGS, pod_spec


def sidecar_env(cronjob: dict[str, Any], settings: OperatorSettings) -> dict[str, Any]:
    injected = build_injection(cronjob, parse_config(cronjob, settings), settings)
    [sidecar] = [c for c in pod_spec(injected)["initContainers"] if c["name"] == "cronlock"]
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in sidecar["env"]}


def test_the_sidecar_gets_the_cronjobs_name_and_the_jobs_uid_and_no_cluster_unnamed() -> None:
    env = sidecar_env(gen.cronjob("nightly-report"), SETTINGS)
    assert env["CRONLOCK_CRONJOB"] == "nightly-report"
    assert env["CRONLOCK_JOB_UID"] == {
        "fieldRef": {
            "apiVersion": "v1",
            "fieldPath": "metadata.labels['batch.kubernetes.io/controller-uid']",
        }
    }
    assert "CRONLOCK_CLUSTER" not in env


def test_a_named_cluster_is_named_to_the_sidecar_and_injection_stays_idempotent() -> None:
    settings = dataclasses.replace(SETTINGS, cluster_name="eu-west-1")
    user = gen.cronjob("report")
    injected = build_injection(user, parse_config(user, settings), settings)
    assert sidecar_env(user, settings)["CRONLOCK_CLUSTER"] == "eu-west-1"
    assert build_injection(injected, parse_config(injected, settings), settings) == injected
    assert revert(injected) == user


def test_the_gate_learns_nothing_of_ticks() -> None:
    user = gen.cronjob("report")
    injected = build_injection(user, parse_config(user, SETTINGS), SETTINGS)
    [gate] = [c for c in pod_spec(injected)["initContainers"] if c["name"] == "cronlock-gate"]
    assert {item["name"] for item in gate["env"]} == {"CRONLOCK_RUN_DIR", "CRONLOCK_WAIT_TIMEOUT"}


def test_the_cluster_name_comes_from_the_flag_or_its_environment_twin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert settings_from(parse_args(["--cluster-name", "east"])).cluster_name == "east"
    monkeypatch.setenv("CRONLOCK_CLUSTER_NAME", "west")
    assert settings_from(parse_args([])).cluster_name == "west"


@pytest.mark.parametrize("name", ["eu west", "x" * 254, "naïve"])
def test_a_cluster_name_a_tick_record_cannot_hold_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=r"cluster name .* is not one; expected 1-253 printable"):
        OperatorSettings(sidecar_image="ghcr.io/example/cronlock:1.0.0", cluster_name=name)
