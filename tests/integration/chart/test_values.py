"""The chart's values: lint, the schema, the defaults the operator accepts, and what each
value renders."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cronlock_operator import cli as operator_cli
from cronlock_operator.settings import images_from
from tests.integration.chart.harness import (
    CHART,
    NON_DEFAULT,
    deployment_env,
    helm,
    render,
    values_file,
)
from tests.support.controlplane import ControlPlane
from tests.support.kube import run_tool
from tests.support.paths import ROOT

INSTALL_DOC = ROOT / "docs" / "INSTALL.md"


# Values that hold a Kubernetes type: one row each in docs/INSTALL.md.
OPAQUE = ("resources", "sidecar.resources", "affinity", "podSecurityContext", "securityContext")


def schema_leaves(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(dotted path, sub-schema) of every value the schema names, objects included."""
    for key, sub in (schema.get("properties") or {}).items():
        dotted = f"{path}.{key}" if path else key
        yield dotted, sub
        if sub.get("type") == "object" and "properties" in sub:
            yield from schema_leaves(sub, dotted)


@pytest.mark.parametrize("values", [None, NON_DEFAULT], ids=["default", "non-default"])
def test_helm_lint_strict_passes(
    controlplane: ControlPlane, tmp_path: Path, values: dict[str, Any] | None
) -> None:
    args = ["lint", "--strict", str(CHART)]
    if values is not None:
        args += ["-f", values_file(tmp_path, values)]

    result = helm(controlplane, *args, check=False)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        (["--set", "replica=2"], "'replica' not allowed"),
        (["--set", "replicas=2"], "replicas > 1 needs leaderElection.enabled=true"),
        (["--set", "image.registry=ghcr.io"], "'registry' not allowed"),
        (["--set", "image.digest=sha256:0"], "/image/digest"),
        (["--set", "serviceAccount.automount=false"], "'automount' not allowed"),
        (["--set-json", 'metrics.port="8080"'], "/metrics/port"),
        (["--set", "logFormat=xml"], "/logFormat"),
        (["--set-json", 'watchNamespaces="team-a"'], "/watchNamespaces"),
        (["--set", "defaults.ttl=sixty"], "/defaults/ttl"),
        (["--set", "serviceMonitor.enabled=yes"], "/serviceMonitor/enabled"),
    ],
    ids=[
        "unknown-top-level",
        "replicas-without-leader-election",
        "unknown-image-key",
        "digest-not-sha256",
        "unknown-serviceaccount-key",
        "port-as-string",
        "log-format-not-in-enum",
        "namespaces-not-a-list",
        "ttl-not-a-duration",
        "enabled-not-a-boolean",
    ],
)
def test_the_schema_refuses_bad_values_naming_the_field(
    controlplane: ControlPlane, setting: list[str], named: str
) -> None:
    result = helm(controlplane, "template", "cronlock", str(CHART), *setting, check=False)

    assert result.returncode != 0, f"{setting} was accepted"
    assert named in result.stderr, result.stderr


DEFAULTS = [
    ("60s", ""),
    ("19s", ""),
    ("18s", ""),
    ("5s", ""),
    ("24h", ""),
    ("86401s", ""),
    ("1.5m", ""),
    ("19.5s", ""),
    ("60s", "20s"),
    ("60s", "20.001s"),
    ("60s", "1s"),
    ("60s", "999ms"),
    ("19s", "6s"),
    ("19s", "7s"),
    ("1h", "20m"),
]


def test_the_chart_accepts_exactly_the_defaults_the_operator_accepts(
    controlplane: ControlPlane,
) -> None:
    """Both ways: a chart that renders starts an operator, and an operator default the
    chart refuses is one the operator would refuse too (exit 78, a crash loop)."""
    verdicts = []
    for ttl, renew in DEFAULTS:
        setting = ["--set", f"defaults.ttl={ttl}", "--set", f"defaults.renew={renew}"]
        rendered = helm(controlplane, "template", "cronlock", str(CHART), *setting, check=False)
        argv = ["--sidecar-image", "x", "--default-ttl", ttl]
        argv += ["--default-renew", renew] if renew else []
        try:
            operator_cli.settings_from(operator_cli.parse_args(argv))
            operator_accepts = True
        except ValueError:
            operator_accepts = False
        if rendered.returncode != 0:
            assert "is not one the operator accepts" in rendered.stderr, rendered.stderr
        verdicts.append((ttl, renew, rendered.returncode == 0, operator_accepts))
    assert [v for v in verdicts if v[2] != v[3]] == [], verdicts
    assert {v[3] for v in verdicts} == {True, False}


def test_metrics_can_be_turned_off_entirely(controlplane: ControlPlane) -> None:
    off = render(
        controlplane,
        "--set",
        "metrics.enabled=false",
        "--set",
        "serviceMonitor.enabled=true",
        "--api-versions",
        "monitoring.coreos.com/v1",
    )
    kinds = {doc["kind"] for doc in off}
    assert "Service" not in kinds
    assert "ServiceMonitor" not in kinds
    [deployment] = [doc for doc in off if doc["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert deployment_env(deployment)["CRONLOCK_METRICS_PORT"] == "0"
    assert [port["name"] for port in container["ports"]] == ["healthz"]


def test_the_pod_security_context_scheduling_and_env_are_the_users_to_set(
    controlplane: ControlPlane,
) -> None:
    docs = render(
        controlplane,
        "--set",
        "podSecurityContext.runAsUser=null,podSecurityContext.runAsGroup=null",
        "--set",
        "podSecurityContext.fsGroup=null,priorityClassName=system-cluster-critical",
        "--set-json",
        'extraEnv=[{"name":"HTTPS_PROXY","value":"http://192.0.2.1:3128"}]',
        "--set-json",
        'topologySpreadConstraints=[{"maxSkew":1,"topologyKey":"zone",'
        '"whenUnsatisfiable":"ScheduleAnyway"}]',
    )
    [deployment] = [doc for doc in docs if doc["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "zone"
    assert deployment_env(deployment)["HTTPS_PROXY"] == "http://192.0.2.1:3128"
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_the_chart_needs_kubernetes_1_30(controlplane: ControlPlane) -> None:
    old = run_tool(
        controlplane.env,
        "helm",
        "template",
        "cronlock",
        str(CHART),
        "--kube-version",
        "1.29.9",
        check=False,
        timeout=90,
        cwd=ROOT,
    )
    assert old.returncode != 0
    assert "requires kubeVersion: >=1.30.0-0" in old.stderr


def test_helm_renders_without_kube_version_as_a_released_helm_does(
    controlplane: ControlPlane,
) -> None:
    """A released helm assumes the Kubernetes its client-go is from (upstream's link flags);
    one built without them assumes 1.20, and `helm template` refuses our chart."""
    rendered = run_tool(
        controlplane.env, "helm", "template", "cronlock", str(CHART), timeout=90, cwd=ROOT
    )
    kinds = {doc["kind"] for doc in yaml.safe_load_all(rendered.stdout) if doc}
    assert "Deployment" in kinds
    linted = run_tool(controlplane.env, "helm", "lint", "--strict", str(CHART), timeout=90)
    assert "1 chart(s) linted, 0 chart(s) failed" in linted.stdout


def test_one_image_registry_moves_every_image_and_the_policy_follows(
    controlplane: ControlPlane,
) -> None:
    """imageRegistry, for a mirror: every image the chart names (the operator's, the
    hooks', the helm test's, the two it injects) and the operator policy's admitted images
    are the mirror's; a digest stays."""
    mirror = "mirror.example.com:5000/cronlock-mirror"
    digest = "sha256:" + "ab" * 32
    docs = render(
        controlplane,
        "--set", f"imageRegistry={mirror}",
        "--set", f"sidecarStoresImage.digest={digest}",
        "--set", "uninstall.revert=true",
        tests=True,
    )  # fmt: skip
    text = yaml.safe_dump_all(docs)
    assert "ghcr.io" not in text
    [deployment] = [doc for doc in docs if doc["kind"] == "Deployment"]
    [operator] = deployment["spec"]["template"]["spec"]["containers"]
    assert operator["image"] == f"{mirror}/cronlock/cronlock:{kube_chart_version()}"
    sidecar = f"{mirror}/cronlock/cronlock-sidecar:{kube_chart_version()}"
    stores = f"{mirror}/cronlock/cronlock-sidecar-stores@{digest}"
    assert images_from(deployment) == (sidecar, stores)
    # The CEL of the operator's policy compares the injected images with these: the one by
    # tag exactly, the one by digest by its digest.
    policies = [doc for doc in docs if doc["kind"] == "ValidatingAdmissionPolicy"]
    admitted = "\n".join(strings(policies))
    assert f'== "{sidecar}"' in admitted
    assert f'.matches("^[^@]+@{digest}$")' in admitted
    # A repository that names no registry gets the mirror in front.
    bare = render(
        controlplane, "--set", "imageRegistry=mirror.local", "--set", "image.repository=team/op"
    )
    [deployment] = [doc for doc in bare if doc["kind"] == "Deployment"]
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"mirror.local/team/op:{kube_chart_version()}"
    refused = helm(
        controlplane, "template", "cronlock", str(CHART), "--set",
        "imageRegistry=https://mirror.example.com", check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "values don't meet the specifications of the schema" in refused.stderr


def strings(node: Any) -> Iterator[str]:
    """Every string in a rendered object, however deep."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)


def kube_chart_version() -> str:
    return str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])


def test_every_object_in_the_schema_is_closed_typed_and_described() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())

    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert schema["additionalProperties"] is False
    for path, sub in schema_leaves(schema):
        if path == "global":  # Helm's own key, shared with a parent chart's other subcharts
            assert sub.get("additionalProperties", True) is not False, "parent charts' globals"
            continue
        assert "type" in sub, f"{path} has no type"
        assert sub.get("description"), f"{path} has no description"
        if sub["type"] == "object":
            # Closed (false) when its keys are ours, a typed map when the user names them.
            assert "additionalProperties" in sub, f"{path} accepts any key"


def test_values_yaml_the_schema_and_install_md_list_the_same_values() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def schema_values(sub: dict[str, Any], path: str = "") -> Iterator[str]:
        for key, child in (sub.get("properties") or {}).items():
            dotted = f"{path}.{key}" if path else key
            if "properties" in child and dotted not in OPAQUE:
                yield from schema_values(child, dotted)
            else:
                yield dotted

    def value_paths(mapping: dict[str, Any], path: str = "") -> Iterator[str]:
        for key, value in mapping.items():
            dotted = f"{path}.{key}" if path else key
            if isinstance(value, dict) and value and dotted not in OPAQUE:
                yield from value_paths(value, dotted)
            else:
                yield dotted

    named = set(schema_values(schema))
    assert set(value_paths(values)) == named
    documented = INSTALL_DOC.read_text()
    missing = sorted(path for path in named if f"`{path}`" not in documented)
    assert not missing, f"docs/INSTALL.md does not describe {missing}"


@pytest.mark.parametrize("values", [None, NON_DEFAULT], ids=["default", "non-default"])
def test_the_deployment_env_is_understood_by_the_operator_cli(
    controlplane: ControlPlane,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    values: dict[str, Any] | None,
) -> None:
    from cronlock_operator import cli

    args = [] if values is None else ["-f", values_file(tmp_path, values)]
    deployment = next(doc for doc in render(controlplane, *args) if doc["kind"] == "Deployment")
    env = deployment_env(deployment)
    for name in [*env, "CRONLOCK_DEFAULT_RENEW"]:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    parsed = cli.parse_args([])
    settings = cli.settings_from(parsed)
    # The images to inject: the Deployment's own init containers, read at start.
    metadata = deployment["metadata"]
    assert parsed.sidecar_images_from == f"{metadata['namespace']}/{metadata['name']}"
    sidecar, _ = images_from(deployment)

    if values is None:
        assert parsed.namespace is None
        assert sidecar == "ghcr.io/cronlock/cronlock-sidecar:0.1.0"
        assert sidecar == cli.DEFAULT_SIDECAR_IMAGE
        assert (settings.default_ttl_seconds, settings.default_renew_seconds) == (60, None)
        assert (parsed.metrics_port, parsed.log_format) == (8080, "plain")
        assert parsed.liveness == "http://0.0.0.0:8081/healthz"
    else:
        assert parsed.namespace == ["team-a", "team-b"]
        assert sidecar == "registry.example.com/platform/cronlock-sidecar:sha-0123abc"
        assert settings.sidecar_image_pull_policy == "Always"
        assert (settings.default_ttl_seconds, settings.default_renew_seconds) == (120, 30)
        assert settings.default_policy == "wait"
        assert (parsed.metrics_port, parsed.log_format) == (9090, "json")
        assert parsed.liveness == "http://0.0.0.0:9091/healthz"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    liveness_port = int(parsed.liveness.rsplit(":", 1)[1].split("/")[0])
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"metrics": parsed.metrics_port, "healthz": liveness_port}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
