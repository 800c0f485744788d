"""The injected containers' UID, GID and resources: settings, flags, injection and re-injection."""

from __future__ import annotations

import copy
import re
from decimal import Decimal
from typing import Any

import pytest

from cronlock_operator import cli
from cronlock_operator.cronjob.config import parse_config
from cronlock_operator.injection.build import build_injection, desired_cronjob, revert
from cronlock_operator.injection.patching import injection_patch, needs_patch
from cronlock_operator.settings import (
    ContainerResources,
    OperatorSettings,
    images_from,
    parse_quantity,
)
from tests.support import gen
from tests.support.cronjobs import (
    SETTINGS,
    apply_json_patch,
    pod_spec,
    server_defaults,
)

OPENSHIFT = OperatorSettings(
    sidecar_image=SETTINGS.sidecar_image,
    sidecar_run_as_user=None,
    sidecar_run_as_group=None,
    sidecar_resources=ContainerResources(cpu_limit="100m", memory_limit="128Mi"),
)
SIGNAL = {"cronlock.io/enabled": "true", "cronlock.io/stop": "signal"}


def inject(cronjob: dict[str, Any], settings: OperatorSettings) -> dict[str, Any]:
    return build_injection(cronjob, parse_config(cronjob, settings), settings)


def injected_containers(cronjob: dict[str, Any]) -> list[dict[str, Any]]:
    containers: list[dict[str, Any]] = pod_spec(cronjob)["initContainers"][:2]
    assert [c["name"] for c in containers] == ["cronlock", "cronlock-gate"]
    return containers


def test_the_defaults_are_the_distroless_nonroot_ids_and_the_old_resources() -> None:
    for container in injected_containers(inject(gen.cronjob("report"), SETTINGS)):
        assert container["securityContext"]["runAsUser"] == 65532
        assert container["securityContext"]["runAsGroup"] == 65532
        assert container["resources"] == {
            "requests": {"cpu": "10m", "memory": "32Mi"},
            "limits": {"memory": "64Mi"},
        }


def test_unset_ids_leave_the_fields_out_and_keep_the_rest_restricted() -> None:
    user = gen.cronjob("report")
    injected = inject(user, OPENSHIFT)
    for container in injected_containers(injected):
        assert container["securityContext"] == {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        assert container["resources"] == {
            "requests": {"cpu": "10m", "memory": "32Mi"},
            "limits": {"cpu": "100m", "memory": "128Mi"},
        }
    assert inject(injected, OPENSHIFT) == injected
    assert revert(injected) == user


def test_configured_ids_and_resources_appear_on_both_containers() -> None:
    settings = OperatorSettings(
        sidecar_image="img",
        sidecar_run_as_user=1000650000,
        sidecar_run_as_group=1000650001,
        sidecar_resources=ContainerResources(
            cpu_request=None, memory_request="16Mi", cpu_limit="0.5", memory_limit=None
        ),
    )
    for container in injected_containers(inject(gen.cronjob("report"), settings)):
        assert container["securityContext"]["runAsUser"] == 1000650000
        assert container["securityContext"]["runAsGroup"] == 1000650001
        assert container["resources"] == {"requests": {"memory": "16Mi"}, "limits": {"cpu": "0.5"}}


@pytest.mark.parametrize("settings", [SETTINGS, OPENSHIFT])
def test_signal_still_runs_the_sidecar_as_the_users_uid(settings: OperatorSettings) -> None:
    user = gen.cronjob(
        "report",
        gen.with_annotations(SIGNAL),
        gen.containers({"name": "main", "image": "app", "securityContext": {"runAsUser": 4242}}),
    )
    injected = inject(user, settings)
    sidecar, gate = injected_containers(injected)
    assert sidecar["securityContext"]["runAsUser"] == 4242
    assert gate["securityContext"].get("runAsUser") == settings.sidecar_run_as_user
    assert sidecar["securityContext"].get("runAsGroup") == settings.sidecar_run_as_group
    assert revert(injected) == user


def test_signal_without_a_users_uid_leaves_the_sidecars_unset_too() -> None:
    sidecar, _ = injected_containers(
        inject(gen.cronjob("report", gen.with_annotations(SIGNAL)), OPENSHIFT)
    )
    assert "runAsUser" not in sidecar["securityContext"]


@pytest.mark.parametrize(
    ("old", "new"),
    [(SETTINGS, OPENSHIFT), (OPENSHIFT, SETTINGS)],
    ids=["to-unset-and-cpu-limit", "back-to-defaults"],
)
def test_new_settings_reinject_a_guarded_cronjob(
    old: OperatorSettings, new: OperatorSettings
) -> None:
    """Level-triggered: the stored injection of the old settings differs from the new desired
    one, the patch makes it so, and revert still gives the user's template back."""
    user = gen.cronjob("report")
    stored = server_defaults(inject(server_defaults(user), old))
    desired = desired_cronjob(stored, parse_config(stored, new), new)
    assert needs_patch(stored, desired)
    patched = server_defaults(apply_json_patch(stored, injection_patch(stored, desired)))
    assert not needs_patch(patched, desired_cronjob(patched, parse_config(patched, new), new))
    for container in injected_containers(patched):
        assert container["securityContext"].get("runAsUser") == new.sidecar_run_as_user
        assert container["resources"] == new.sidecar_resources.as_spec()
    written = server_defaults(user)
    assert pod_spec(revert(patched)) == pod_spec(written)
    assert revert(patched)["metadata"]["annotations"] == written["metadata"]["annotations"]


def test_a_quantity_as_the_api_server_stores_it_is_no_difference() -> None:
    """0.5 comes back as 500m, and a request left out comes back equal to its limit."""
    settings = OperatorSettings(
        sidecar_image="img",
        sidecar_resources=ContainerResources(
            cpu_request=None, memory_request="32Mi", cpu_limit="0.5", memory_limit="1024Mi"
        ),
    )
    stored = server_defaults(inject(gen.cronjob("report"), settings))
    for container in injected_containers(stored):
        container["resources"] = {
            "requests": {"cpu": "500m", "memory": "32Mi"},
            "limits": {"cpu": "500m", "memory": "1Gi"},
        }
    desired = desired_cronjob(stored, parse_config(stored, settings), settings)
    assert not needs_patch(stored, desired)
    tampered = copy.deepcopy(stored)
    injected_containers(tampered)[0]["resources"]["limits"]["cpu"] = "600m"
    assert needs_patch(tampered, desired)
    tampered = copy.deepcopy(stored)
    injected_containers(tampered)[1]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    assert needs_patch(tampered, desired)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("10m", Decimal("0.01")),
        ("0.5", Decimal("0.5")),
        ("64Mi", Decimal(64 * 2**20)),
        ("128M", Decimal(128 * 10**6)),
        ("1e3", Decimal(1000)),
        ("6.7108864e+07", Decimal(67108864)),
        (".5", Decimal("0.5")),
    ],
)
def test_quantities_are_read_as_kubernetes_reads_them(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"sidecar_run_as_user": 0}, "sidecar runAsUser 0 is not a non-root id"),
        ({"sidecar_run_as_group": 0}, "sidecar runAsGroup 0 is not a non-root id"),
        ({"sidecar_run_as_user": -5}, "expected 1 to 2147483647, or unset"),
        ({"sidecar_run_as_user": 2**31}, "is not a non-root id"),
    ],
)
def test_a_root_or_impossible_id_is_refused(changes: dict[str, Any], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        OperatorSettings(sidecar_image="img", **changes)


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"cpu_request": "ten"}, "sidecar cpu request: 'ten' is not a Kubernetes quantity"),
        ({"memory_limit": "64MB"}, "sidecar memory limit: '64MB' is not a Kubernetes quantity"),
        ({"memory_limit": "-1Mi"}, "is not a Kubernetes quantity"),
        ({"cpu_limit": "0"}, "sidecar cpu limit: '0' must be more than 0"),
        ({"cpu_limit": "5m"}, "sidecar cpu limit 5m is less than its request 10m"),
        ({"memory_limit": "16Mi"}, "sidecar memory limit 16Mi is less than its request 32Mi"),
    ],
)
def test_bad_resources_are_refused(changes: dict[str, Any], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        ContainerResources(**changes)


def test_a_limit_equal_to_its_request_is_accepted() -> None:
    resources = ContainerResources(cpu_request="100m", cpu_limit="0.1")
    assert resources.as_spec()["limits"] == {"cpu": "0.1", "memory": "64Mi"}


def test_flags_and_their_env_twins_reach_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRONLOCK_SIDECAR_RUN_AS_USER", "")
    monkeypatch.setenv("CRONLOCK_SIDECAR_CPU_LIMIT", "200m")
    monkeypatch.setenv("CRONLOCK_SIDECAR_MEMORY_LIMIT", "")
    settings = cli.settings_from(
        cli.parse_args(["--sidecar-run-as-group", "1000", "--sidecar-memory-request", "48Mi"])
    )
    assert settings.sidecar_run_as_user is None
    assert settings.sidecar_run_as_group == 1000
    assert settings.sidecar_resources == ContainerResources(
        cpu_request="10m", memory_request="48Mi", cpu_limit="200m", memory_limit=None
    )


def test_without_flags_the_settings_are_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("USER", "GROUP"):
        monkeypatch.delenv(f"CRONLOCK_SIDECAR_RUN_AS_{name}", raising=False)
    for name in ("CPU_REQUEST", "MEMORY_REQUEST", "CPU_LIMIT", "MEMORY_LIMIT"):
        monkeypatch.delenv(f"CRONLOCK_SIDECAR_{name}", raising=False)
    settings = cli.settings_from(cli.parse_args([]))
    assert (settings.sidecar_run_as_user, settings.sidecar_run_as_group) == (65532, 65532)
    assert settings.sidecar_resources == ContainerResources()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--sidecar-run-as-user", "nobody"], "--sidecar-run-as-user: 'nobody' is not a numeric"),
        (["--sidecar-run-as-group", "0"], "sidecar runAsGroup 0 is not a non-root id"),
        (["--sidecar-cpu-limit", "1m"], "sidecar cpu limit 1m is less than its request 10m"),
    ],
)
def test_bad_flags_stop_the_operator_with_the_reason(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 78
    assert said in capsys.readouterr().err


def deployment(*init: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "cronlock-system", "name": "cronlock"},
        "spec": {"template": {"spec": {"initContainers": list(init), "containers": []}}},
    }


def test_the_images_to_inject_are_the_deployments_two_init_containers() -> None:
    """What --sidecar-images-from reads (the chart's deployment.yaml renders them)."""
    sidecar = {"name": "sidecar-image", "image": "mirror.example.com/s@sha256:" + "2" * 64}
    stores = {"name": "sidecar-stores-image", "image": "mirror.example.com/t:1"}
    assert images_from(deployment(sidecar, stores)) == (sidecar["image"], stores["image"])
    assert images_from(deployment(stores, sidecar)) == (sidecar["image"], stores["image"])
    # No stores image: CronJobs with a store are refused, as with --sidecar-stores-image ''.
    assert images_from(deployment(sidecar)) == (sidecar["image"], None)


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (deployment(), "deployment cronlock-system/cronlock has no init container 'sidecar-image'"),
        ({"spec": None}, "deployment ?/? has no init container 'sidecar-image'"),
        (deployment({"name": "sidecar-image", "image": " "}), "no init container 'sidecar-image'"),
        (
            deployment({"name": "sidecar-image", "image": "s:1"}, {"name": "sidecar-stores-image"}),
            "init container 'sidecar-stores-image' has no image",
        ),
    ],
)
def test_a_deployment_that_names_no_image_is_refused_saying_what_is_missing(
    body: dict[str, Any], said: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        images_from(body)
