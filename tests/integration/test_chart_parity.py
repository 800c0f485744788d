"""The chart's knobs that cert-manager's, External Secrets' and Kyverno's charts have, rendered
by the real helm (and installed against the real API server where a cluster matters):
monitoring.renderMode, commonLabels, extraObjects, global.imageRegistry and
global.imagePullSecrets."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.controlplane import ControlPlane
from tests.support.kube import run_tool
from tests.support.operator import kube_version
from tests.support.paths import ROOT

pytestmark = pytest.mark.timeout(300)
CHART = ROOT / "charts" / "cronlock"
MONITORS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
ALL_MONITORS = (
    "--set",
    "serviceMonitor.enabled=true,podMonitor.enabled=true,prometheusRule.enabled=true",
)
SERVED = ("--api-versions", "monitoring.coreos.com/v1")


def helm(controlplane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return run_tool(controlplane.env, "helm", *args, check=False, timeout=90, cwd=ROOT)


def template(controlplane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return helm(
        controlplane, "template", "cronlock", str(CHART), "--kube-version", kube_version(), *args
    )


def render(controlplane: ControlPlane, *args: str) -> list[dict[str, Any]]:
    done = template(controlplane, *args)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def kinds(docs: list[dict[str, Any]]) -> set[str]:
    return {doc["kind"] for doc in docs}


def values_file(directory: Path, values: dict[str, Any]) -> str:
    path = directory / f"values-{secrets.token_hex(3)}.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


class _UniqueKeys(yaml.SafeLoader):
    """A YAML loader that refuses a key written twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [self.construct_object(key, deep=deep) for key, _ in node.value]
        twice = sorted({str(key) for key in keys if keys.count(key) > 1})
        assert not twice, f"{twice} twice in one mapping, line {node.start_mark.line + 1}"
        return super().construct_mapping(node, deep=deep)


# --- monitoring.renderMode ---------------------------------------------------------------
def test_skip_if_missing_renders_the_monitors_only_where_the_api_is_served(
    controlplane: ControlPlane,
) -> None:
    assert not kinds(render(controlplane, *ALL_MONITORS)) & MONITORS  # helm template: unseen
    assert kinds(render(controlplane, *ALL_MONITORS, *SERVED)) >= MONITORS


def test_always_render_renders_them_under_helm_template_without_the_api(
    controlplane: ControlPlane,
) -> None:
    always = ("--set", "monitoring.renderMode=alwaysRender")
    assert kinds(render(controlplane, *ALL_MONITORS, *always)) >= MONITORS
    # Enabled is still the switch: alwaysRender renders what is enabled, nothing more.
    assert not kinds(render(controlplane, *always)) & MONITORS
    # And a monitor on metrics needs the metrics: the PodMonitor (the sidecars') stays.
    off = render(controlplane, *ALL_MONITORS, *always, "--set", "metrics.enabled=false")
    assert kinds(off) & MONITORS == {"PodMonitor"}


@pytest.mark.parametrize(
    ("enabled", "kind"),
    [
        ("serviceMonitor.enabled", "ServiceMonitor"),
        ("podMonitor.enabled", "PodMonitor"),
        ("prometheusRule.enabled", "PrometheusRule"),
    ],
)
def test_fail_if_missing_fails_naming_the_key_and_the_remedies(
    controlplane: ControlPlane, enabled: str, kind: str
) -> None:
    failing = ("--set", f"{enabled}=true,monitoring.renderMode=failIfMissing")
    failed = template(controlplane, *failing)
    assert failed.returncode != 0
    assert f"{enabled} is true but this cluster does not serve monitoring.coreos.com/v1" in (
        failed.stderr
    )
    assert "--api-versions monitoring.coreos.com/v1" in failed.stderr
    assert "monitoring.renderMode=alwaysRender" in failed.stderr
    assert kind in kinds(render(controlplane, *failing, *SERVED))
    # Nothing enabled, nothing to fail for.
    assert template(controlplane, "--set", "monitoring.renderMode=failIfMissing").returncode == 0


def test_an_unknown_render_mode_is_refused_by_the_schema(controlplane: ControlPlane) -> None:
    refused = template(controlplane, "--set", "monitoring.renderMode=always")
    assert refused.returncode != 0
    assert "renderMode" in refused.stderr
    assert "alwaysRender" in refused.stderr


def test_the_release_notes_name_every_monitor_skipped(
    controlplane: ControlPlane, namespace: str
) -> None:
    """`helm install` against the real API server, which serves no monitoring.coreos.com."""

    def notes(*args: str) -> str:
        done = helm(
            controlplane, "install", f"notes-{secrets.token_hex(2)}", str(CHART),
            "-n", namespace, "--dry-run=server", *args,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.split("NOTES:", 1)[1]

    skipped = notes(*ALL_MONITORS)
    for key, kind in [
        ("serviceMonitor", "ServiceMonitor"),
        ("podMonitor", "PodMonitor"),
        ("prometheusRule", "PrometheusRule"),
    ]:
        assert f"WARNING: {key}.enabled is true but this cluster does not serve" in skipped
        assert f"so no {kind} was created" in skipped
    assert "monitoring.renderMode=failIfMissing makes this an error" in skipped
    only = notes("--set", "podMonitor.enabled=true")
    assert "podMonitor.enabled is true" in only
    assert "serviceMonitor.enabled" not in only
    assert "WARNING" not in notes()


# --- commonLabels --------------------------------------------------------------------------
def everything(tmp_path: Path, **more: Any) -> list[str]:
    """Values that render every object the chart has with `helm template`."""
    values = {
        "monitoring": {"renderMode": "alwaysRender"},
        "serviceMonitor": {"enabled": True},
        "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "grafana": {"dashboard": {"enabled": True}},
        "networkPolicy": {"enabled": True},
        "replicas": 2,
        "leaderElection": {"enabled": True},
        "uninstall": {"revert": True},
        **more,
    }
    return [
        "-f", values_file(tmp_path, values),
        "--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy",
    ]  # fmt: skip


def pod_templates(doc: dict[str, Any]) -> list[dict[str, Any]]:
    if doc["kind"] == "Pod":
        return [doc]
    if doc["kind"] in ("Deployment", "Job"):
        return [doc["spec"]["template"]]
    return []


def test_common_labels_are_on_every_object_hooks_and_tests_included(
    controlplane: ControlPlane, tmp_path: Path
) -> None:
    common = {"team": "platform", "example.com/cost-centre": "cc-42"}
    plain = render(controlplane, *everything(tmp_path), "--skip-tests")
    docs = render(controlplane, *everything(tmp_path, commonLabels=common))
    assert {"Pod", "Job", "Deployment", "PrometheusRule", "MutatingAdmissionPolicy"} <= kinds(docs)
    assert len(docs) > len(plain)  # helm test's objects are among them
    for doc in docs:
        for labelled in [doc, *pod_templates(doc)]:
            labels = labelled["metadata"]["labels"]
            where = f"{doc['kind']}/{doc['metadata']['name']}"
            assert labels.items() >= common.items(), where
            assert labels["app.kubernetes.io/part-of"] == "cronlock", where
    # Not in a selector: the Deployment's is immutable, and the Service's picks pods.
    [deployment] = [doc for doc in docs if doc["kind"] == "Deployment"]
    assert "team" not in deployment["spec"]["selector"]["matchLabels"]
    [service] = [doc for doc in docs if doc["kind"] == "Service"]
    assert "team" not in service["spec"]["selector"]


def test_an_objects_own_labels_win_over_common_labels_and_each_key_is_written_once(
    controlplane: ControlPlane, tmp_path: Path
) -> None:
    values = {
        "commonLabels": {"team": "platform", "release": "none", "grafana_dashboard": "0"},
        "podLabels": {"team": "ops"},
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    }
    args = everything(tmp_path, **values)
    done = template(controlplane, *args)
    assert done.returncode == 0, done.stderr
    # A key twice in one mapping is a duplicate that YAML readers refuse or silently drop.
    assert [doc for doc in yaml.load_all(done.stdout, Loader=_UniqueKeys) if doc]
    docs = render(controlplane, *args)
    [deployment] = [doc for doc in docs if doc["kind"] == "Deployment"]
    assert deployment["metadata"]["labels"]["team"] == "platform"
    assert deployment["spec"]["template"]["metadata"]["labels"]["team"] == "ops"
    [monitor] = [doc for doc in docs if doc["kind"] == "ServiceMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    [dashboard] = [doc for doc in docs if doc["kind"] == "ConfigMap"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"  # the sidecar's


@pytest.mark.parametrize(
    "key", ["app.kubernetes.io/name", "helm.sh/chart", "cronlock.io/lock", "bad key", "a/b/c"]
)
def test_common_labels_that_would_forge_the_charts_own_or_are_no_label_are_refused(
    controlplane: ControlPlane, tmp_path: Path, key: str
) -> None:
    refused = template(controlplane, "-f", values_file(tmp_path, {"commonLabels": {key: "x"}}))
    assert refused.returncode != 0
    assert "commonLabels" in refused.stderr or key in refused.stderr, refused.stderr
    bad_value = template(
        controlplane, "-f", values_file(tmp_path, {"commonLabels": {"team": "not a value"}})
    )
    assert bad_value.returncode != 0


# --- extraObjects --------------------------------------------------------------------------
def test_extra_objects_are_rendered_through_tpl_as_maps_or_strings(
    controlplane: ControlPlane, tmp_path: Path, namespace: str
) -> None:
    extra = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "{{ .Release.Name }}-extra"},
            "data": {"namespace": "{{ .Release.Namespace }}", "ttl": "{{ .Values.defaults.ttl }}"},
        },
        "apiVersion: v1\nkind: Secret\nmetadata:\n"
        '  name: {{ include "cronlock.fullname" . }}-store\n'
        "stringData:\n  url: redis://redis.{{ .Release.Namespace }}:6379\n",
    ]
    args = ["-f", values_file(tmp_path, {"extraObjects": extra, "commonLabels": {"t": "x"}})]
    docs = render(controlplane, "-n", namespace, *args)
    [config_map] = [doc for doc in docs if doc["metadata"]["name"] == "cronlock-extra"]
    assert config_map["data"] == {"namespace": namespace, "ttl": "60s"}
    [secret] = [doc for doc in docs if doc["kind"] == "Secret"]
    assert secret["metadata"]["name"] == "cronlock-store"
    assert secret["stringData"] == {"url": f"redis://redis.{namespace}:6379"}
    # They carry their own labels only (commonLabels are the chart's objects').
    assert "labels" not in config_map["metadata"]
    # And they install with the release, on the real API server, and go with it.
    release = f"extra-{secrets.token_hex(2)}"
    installed = helm(controlplane, "install", release, str(CHART), "-n", namespace, *args)
    assert installed.returncode == 0, installed.stderr
    got = controlplane.kubectl(
        "get", "configmap", f"{release}-extra", "-n", namespace, "-o", "yaml"
    )
    assert yaml.safe_load(got)["data"] == {"namespace": namespace, "ttl": "60s"}
    helm(controlplane, "uninstall", release, "-n", namespace, "--wait")
    gone = controlplane.kubectl("get", "configmap", "-n", namespace, "-o", "name")
    assert f"configmap/{release}-extra" not in gone
    empty = template(controlplane, "-f", values_file(tmp_path, {"extraObjects": [{}]}))
    assert empty.returncode != 0
    assert "extraObjects" in empty.stderr


# --- global.imageRegistry, global.imagePullSecrets --------------------------------------
def images(docs: list[dict[str, Any]]) -> set[str]:
    found = set()
    for doc in docs:
        for pod in pod_templates(doc):
            spec = pod["spec"]
            for container in [*spec.get("initContainers", []), *spec["containers"]]:
                found.add(container["image"])
    return found


def test_global_image_registry_wins_over_image_registry_everywhere_images_are_named(
    controlplane: ControlPlane, tmp_path: Path
) -> None:
    mirror = "mirror.example.com:5000/cache"
    values = {"global": {"imageRegistry": mirror}, "imageRegistry": "local.example.com"}
    docs = render(controlplane, *everything(tmp_path, **values))
    named = images(docs)
    assert named == {
        f"{mirror}/cronlock/cronlock:0.1.0",
        f"{mirror}/cronlock/cronlock-sidecar:0.1.0",
        f"{mirror}/cronlock/cronlock-sidecar-stores:0.1.0",
    }
    # The operator's policy admits the images so named, not the unmirrored ones.
    policies = yaml.safe_dump([doc for doc in docs if doc["kind"] == "ValidatingAdmissionPolicy"])
    assert f"{mirror}/cronlock/cronlock-sidecar:0.1.0" in policies
    assert "ghcr.io/cronlock" not in policies
    assert "local.example.com" not in yaml.safe_dump(docs)
    # Unset (a parent chart's global without it), imageRegistry applies as before.
    local = render(controlplane, "--set", "imageRegistry=local.example.com,global.other=1")
    assert {image.split("/")[0] for image in images(local)} == {"local.example.com"}
    bad = template(controlplane, "--set", "global.imageRegistry=https://mirror")
    assert bad.returncode != 0
    assert "imageRegistry" in bad.stderr


def test_global_pull_secrets_join_the_charts_on_every_pod_it_runs(
    controlplane: ControlPlane, tmp_path: Path
) -> None:
    values = {
        "global": {"imagePullSecrets": ["parent-cred", {"name": "shared-cred"}]},
        "imagePullSecrets": [{"name": "shared-cred"}, {"name": "own-cred"}],
    }
    docs = render(controlplane, *everything(tmp_path, **values))
    pods = [pod for doc in docs for pod in pod_templates(doc)]
    assert len(pods) == 3  # the operator, the uninstall hook, helm test's
    for pod in pods:
        assert pod["spec"]["imagePullSecrets"] == [
            {"name": "parent-cred"},
            {"name": "shared-cred"},
            {"name": "own-cred"},
        ]
    none = render(controlplane, *everything(tmp_path))
    assert all("imagePullSecrets" not in pod["spec"] for d in none for pod in pod_templates(d))
    bad = template(controlplane, "--set-json", 'global.imagePullSecrets=[{"secret":"x"}]')
    assert bad.returncode != 0
    assert "imagePullSecrets" in bad.stderr
