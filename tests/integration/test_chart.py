"""The Helm chart against a real API server: schema, install, RBAC, restricted pod security."""

from __future__ import annotations

import json
import re
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from cronlock_operator import cli as operator_cli
from cronlock_operator.settings import images_from
from tests.support.controlplane import ControlPlane, ServiceAccountKubeconfig
from tests.support.kube import run_tool, wait_for
from tests.support.operator import kube_version
from tests.support.paths import ROOT
from tests.support.prometheus import alert_expr, promql_eval, rule_file
from tests.support.tools import gotool

CHART = ROOT / "charts" / "cronlock"
INSTALL_YAML = ROOT / "manifests" / "install.yaml"
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
INSTALL_DOC = ROOT / "docs" / "INSTALL.md"
REGENERATE = "manifests/render > manifests/install.yaml"
# Values that hold a Kubernetes type: one row each in docs/INSTALL.md.
OPAQUE = ("resources", "sidecar.resources", "affinity", "podSecurityContext", "securityContext")
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/warn": "restricted",
}

# What the operator does (operator/src/cronlock_operator/kube/writes.py and the kopf watches),
# and so exactly what the chart grants.
GRANTED: dict[tuple[str, str], set[str]] = {
    ("batch", "cronjobs"): {"get", "list", "watch", "patch"},
    ("batch", "jobs"): {"get", "list", "watch", "patch", "delete"},
    ("coordination.k8s.io", "leases"): {
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
    },
    ("rbac.authorization.k8s.io", "roles"): {"get", "list", "create", "update", "delete"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"get", "list", "create", "update", "delete"},
    # The pod a Lease's new holder names, by name (review N4: a hold by no run is broken).
    ("", "pods"): {"get"},
    ("", "events"): {"create"},
}
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
# Cluster-wide, for namespace opt-in (values: namespaceOptIn, on by default): read only.
NAMESPACES_GRANTED = {"get", "list", "watch"}
# (verb, group, resource, namespaced): what a compromised operator must not be able to do.
REFUSED = [
    ("list", "", "secrets", True),
    ("get", "", "secrets", True),
    ("create", "", "pods", True),
    ("list", "", "pods", True),
    ("watch", "", "pods", True),
    ("update", "", "pods", True),
    ("delete", "", "pods", True),
    ("get", "", "configmaps", True),
    ("create", "", "serviceaccounts", True),
    ("create", "batch", "cronjobs", True),
    ("delete", "batch", "cronjobs", True),
    ("update", "batch", "cronjobs", True),
    ("create", "batch", "jobs", True),
    ("escalate", "rbac.authorization.k8s.io", "roles", True),
    ("bind", "rbac.authorization.k8s.io", "roles", True),
    ("patch", "rbac.authorization.k8s.io", "rolebindings", True),
    ("create", "events.k8s.io", "events", True),
    ("update", "apps", "deployments", True),
    ("patch", "", "namespaces", False),
    ("delete", "", "namespaces", False),
    ("create", "rbac.authorization.k8s.io", "clusterroles", False),
    ("create", "rbac.authorization.k8s.io", "clusterrolebindings", False),
    ("list", "apiextensions.k8s.io", "customresourcedefinitions", False),
]

# Every value set to something other than its default (watchNamespaces filled in per test).
NON_DEFAULT: dict[str, Any] = {
    "image": {
        "repository": "registry.example.com/platform/cronlock",
        "tag": "0.1.0-rc.1",
        "pullPolicy": "Always",
    },
    "sidecarImage": {
        "repository": "registry.example.com/platform/cronlock-sidecar",
        "tag": "sha-0123abc",
        "pullPolicy": "Always",
    },
    "watchNamespaces": ["team-a", "team-b"],
    "namespaceOptIn": False,
    "defaults": {"ttl": "2m", "renew": "30s", "policy": "wait"},
    "logFormat": "json",
    "metrics": {"port": 9090},
    "liveness": {"port": 9091},
    "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prometheus"}},
    "resources": {
        "requests": {"cpu": "20m", "memory": "64Mi"},
        "limits": {"cpu": 1, "memory": "128Mi"},
    },
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}
    ],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "kubernetes.io/arch",
                                "operator": "In",
                                "values": ["amd64", "arm64"],
                            }
                        ]
                    }
                ]
            }
        }
    },
    "podAnnotations": {"example.com/team": "ops"},
    "podLabels": {"example.com/team": "ops"},
    "imagePullSecrets": [{"name": "regcred"}],
    "nameOverride": "lock",
    "fullnameOverride": "",
    "serviceAccount": {
        "create": True,
        "name": "cronlock-operator",
        "annotations": {"example.com/role": "cronlock"},
    },
}


# --- helpers ----------------------------------------------------------------------------
def helm(
    controlplane: ControlPlane, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    if args[:1] == ("template",):
        args = (*args, "--kube-version", kube_version())
    return run_tool(controlplane.env, "helm", *args, check=check, timeout=90, cwd=ROOT)


def values_file(directory: Path, values: dict[str, Any]) -> str:
    path = directory / f"values-{secrets.token_hex(3)}.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def render(controlplane: ControlPlane, *args: str, tests: bool = False) -> list[dict[str, Any]]:
    """`helm template`; without `helm test`'s objects unless `tests`."""
    skip = () if tests else ("--skip-tests",)
    output = helm(controlplane, "template", "cronlock", str(CHART), *skip, *args).stdout
    return [doc for doc in yaml.safe_load_all(output) if doc]


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(doc["kind"] for doc in docs)


def label_restricted(controlplane: ControlPlane, namespace: str) -> None:
    controlplane.kubectl(
        "label",
        "namespace",
        namespace,
        "--overwrite",
        *(f"{key}={value}" for key, value in RESTRICTED.items()),
    )


def dry_run_pod(
    controlplane: ControlPlane, namespace: str, template: dict[str, Any], *flags: str
) -> str:
    """Create a Pod from a pod template with a server-side dry run (PodSecurity enforces);
    `flags` for kubectl, e.g. `-o json` for the Pod as admitted."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"dry-run-{secrets.token_hex(3)}",
            "namespace": namespace,
            "labels": (template.get("metadata") or {}).get("labels") or {},
        },
        "spec": template["spec"],
    }
    return controlplane.kubectl(
        "create", "--dry-run=server", "-n", namespace, *flags, "-f", "-",
        input_text=json.dumps(pod),
    )  # fmt: skip


def deployment_env(deployment: dict[str, Any]) -> dict[str, str]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item.get("value", "") for item in container["env"]}


def can(
    client: kubernetes.client.ApiClient, verb: str, group: str, resource: str, **where: str
) -> bool:
    review = kubernetes.client.AuthorizationV1Api(client).create_self_subject_access_review(
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                    **where,
                }
            },
        }
    )
    return bool(review.status.allowed)


def schema_leaves(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(dotted path, sub-schema) of every value the schema names, objects included."""
    for key, sub in (schema.get("properties") or {}).items():
        dotted = f"{path}.{key}" if path else key
        yield dotted, sub
        if sub.get("type") == "object" and "properties" in sub:
            yield from schema_leaves(sub, dotted)


Install = Callable[..., str]


@pytest.fixture
def install(controlplane: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[Install]:
    """`helm install` into the test's namespace (labelled restricted); uninstalled afterwards."""
    releases: list[str] = []

    def run(values: dict[str, Any] | None = None) -> str:
        label_restricted(controlplane, namespace)
        release = f"cl-{secrets.token_hex(3)}"
        args = ["install", release, str(CHART), "-n", namespace, "--wait=false"]
        if values is not None:
            args += ["-f", values_file(tmp_path, values)]
        result = helm(controlplane, *args)
        releases.append(release)
        assert "kubectl annotate cronjob NAME" in result.stdout  # NOTES.txt
        return release

    yield run
    for release in releases:
        # ClusterRole(Binding)s outlive the namespace; uninstall removes them.
        helm(controlplane, "uninstall", release, "-n", namespace, check=False)


@pytest.fixture
def extra_namespace(api: kubernetes.client.ApiClient) -> Iterator[Callable[[], str]]:
    core = kubernetes.client.CoreV1Api(api)
    made: list[str] = []

    def make() -> str:
        name = f"chart-extra-{secrets.token_hex(3)}"
        core.create_namespace({"metadata": {"name": name}})
        made.append(name)
        return name

    yield make
    for name in made:
        core.delete_namespace(name, propagation_policy="Background")


# --- lint and schema ----------------------------------------------------------------------
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


def rulecheck_binary() -> str:
    """Prometheus' own parser (rulefmt and PromQL), built from its pinned Go module."""
    return gotool("rulecheck")


def rulecheck(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [rulecheck_binary(), str(path)], capture_output=True, text=True, timeout=60
    )


def test_the_prometheus_rule_parses_as_prometheus_parses_it_with_thresholds_from_values(
    controlplane: ControlPlane, tmp_path: Path
) -> None:
    on = ["--set", "prometheusRule.enabled=true", "--api-versions", "monitoring.coreos.com/v1"]
    assert "PrometheusRule" not in kinds(
        render(controlplane, "--set", "prometheusRule.enabled=true")
    )
    assert "PrometheusRule" not in kinds(
        render(controlplane, *on, "--set", "metrics.enabled=false")
    )

    default = rule_file(tmp_path, render(controlplane, *on))
    checked = rulecheck(default)
    assert checked.returncode == 0, checked.stderr
    assert "1 groups, 7 rules" in checked.stdout
    tuned = render(
        controlplane,
        *on,
        "--set",
        "prometheusRule.repeatedSkips=7,prometheusRule.reconcileErrors=0",
        "--set",
        "prometheusRule.window=1h,prometheusRule.operatorDownFor=2m",
        "--set",
        "prometheusRule.notGuardedFor=30m,prometheusRule.severities.notGuarded=info",
        "--set",
        "prometheusRule.severities.repeatedSkips=page,prometheusRule.labels.release=kube-prometheus",
        "--set",
        "prometheusRule.runbookBaseURL=https://wiki.example.com/cronlock#",
    )
    [rule] = [doc for doc in tuned if doc["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    alerts = {alert["alert"]: alert for alert in rule["spec"]["groups"][0]["rules"]}
    assert set(alerts) == {
        "CronlockRepeatedSkips",
        "CronlockExpiredHoldCleared",
        "CronlockOperatorDown",
        "CronlockReconcileErrors",
        "CronlockCronJobsNotGuarded",
        "CronlockRunsMissed",
        "CronlockNotSucceeding",
    }
    assert alerts["CronlockRepeatedSkips"]["expr"].endswith(">= 7")
    assert alerts["CronlockRunsMissed"]["expr"].endswith("[1h])) > 0")
    assert alerts["CronlockCronJobsNotGuarded"]["for"] == "30m"
    assert alerts["CronlockReconcileErrors"]["expr"].endswith("[1h])) > 0")
    assert alerts["CronlockOperatorDown"]["for"] == "2m"
    assert {name: alert["labels"]["severity"] for name, alert in alerts.items()} == {
        "CronlockRepeatedSkips": "page",
        "CronlockExpiredHoldCleared": "warning",
        "CronlockOperatorDown": "critical",
        "CronlockReconcileErrors": "warning",
        "CronlockCronJobsNotGuarded": "info",
        "CronlockRunsMissed": "warning",
        "CronlockNotSucceeding": "warning",
    }
    assert {name: alert["annotations"]["runbook_url"] for name, alert in alerts.items()} == {
        name: f"https://wiki.example.com/cronlock#{name.lower()}" for name in alerts
    }
    # Every default runbook_url names a section docs/RUNBOOK.md has.
    runbook = (ROOT / "docs" / "RUNBOOK.md").read_text()
    anchors = {f"#{title.lower()}" for title in re.findall(r"^## (\w+)$", runbook, re.M)}
    [default_rule] = [doc for doc in render(controlplane, *on) if doc["kind"] == "PrometheusRule"]
    for alert in default_rule["spec"]["groups"][0]["rules"]:
        url = alert["annotations"]["runbook_url"]
        assert url.startswith("https://github.com/cronlock/cronlock/blob/main/docs/RUNBOOK.md#")
        assert url[url.index("#") :] in anchors, url
    assert rulecheck(rule_file(tmp_path, tuned)).returncode == 0
    # The check can fail: one broken expression is named.
    broken = default.read_text().replace(">= 3", ">= = 3")
    default.write_text(broken)
    refused = rulecheck(default)
    assert refused.returncode == 1
    assert '"CronlockRepeatedSkips": could not parse expression' in refused.stderr


def exported_series() -> set[str]:
    """Every series name the operator's registry can export, suffixes included."""
    from cronlock_operator.runtime import metrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    return {
        family.name + suffix
        for family in metrics.registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }


# Scrape series Prometheus adds itself, which the dashboard reads too.
SCRAPE_SERIES = {"up"}
GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$__range": "6h",
    "$namespace": ".*",
    "$job": ".*",
    "$cluster": ".*",
}


def metrics_named(path: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    binary = rulecheck_binary()
    checked = subprocess.run(
        [binary, "-metrics", str(path)], capture_output=True, text=True, timeout=60
    )
    names = set(re.findall(r"^metric: (\S+)$", checked.stdout, re.M))
    return checked, names


def dashboard_rule_file(directory: Path, dashboard: dict[str, Any]) -> Path:
    """Every panel query as a recording rule, Grafana's variables given values, so
    Prometheus' own parser reads each expression."""
    rules = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"panel {panel['title']!r}: a variable left in {expr!r}"
            rules.append(
                {"record": f"dashboard:panel_{panel['id']}_{target['refId']}", "expr": expr}
            )
    path = directory / f"dashboard-{secrets.token_hex(3)}.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    return path


def test_the_grafana_dashboard_renders_parses_and_names_only_exported_metrics(
    controlplane: ControlPlane, tmp_path: Path
) -> None:
    assert "ConfigMap" not in kinds(render(controlplane))
    [config_map] = [
        doc
        for doc in render(
            controlplane,
            "--set",
            "grafana.dashboard.enabled=true,grafana.dashboard.namespace=monitoring",
            "--set",
            "grafana.dashboard.annotations.grafana_folder=cronlock",
        )
        if doc["kind"] == "ConfigMap"
    ]
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "cronlock"}
    dashboard = json.loads(config_map["data"]["cronlock.json"])
    assert dashboard["uid"] == "cronlock"
    variables = {variable["name"] for variable in dashboard["templating"]["list"]}
    assert variables == {"datasource", "cluster", "namespace", "job"}
    # Every query follows the cluster chosen (a Thanos or federated Prometheus' label).
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            assert 'cluster=~"$cluster"' in target["expr"], panel["title"]
    path = dashboard_rule_file(tmp_path, dashboard)
    checked, names = metrics_named(path)
    assert checked.returncode == 0, checked.stderr
    panels = sum(len(panel["targets"]) for panel in dashboard["panels"])
    assert f"1 groups, {panels} rules" in checked.stdout
    exported = exported_series()
    assert names - exported == SCRAPE_SERIES
    # What the dashboard shows of the operator's own series.
    assert {
        "cronlock_lease_held",
        "cronlock_runs_total",
        "cronlock_consecutive_skips",
        "cronlock_takeovers_total",
        "cronlock_reconcile_duration_seconds_bucket",
        "cronlock_missed_runs_total",
        "cronlock_not_succeeding",
        "cronlock_lock_frozen_until_timestamp_seconds",
    } <= names
    # The check can fail: a misspelt series is named as not exported.
    path.write_text(path.read_text().replace("cronlock_lease_held", "cronlock_leases_held"))
    _, misspelt = metrics_named(path)
    assert misspelt - exported == SCRAPE_SERIES | {"cronlock_leases_held"}


def test_every_alert_names_only_exported_metrics(
    controlplane: ControlPlane, tmp_path: Path
) -> None:
    on = ["--set", "prometheusRule.enabled=true", "--api-versions", "monitoring.coreos.com/v1"]
    checked, names = metrics_named(rule_file(tmp_path, render(controlplane, *on)))
    assert checked.returncode == 0, checked.stderr
    # Nothing but cronlock's own series: CronlockOperatorDown reads cronlock_leader,
    # which every replica serves, not `up`.
    assert names - exported_series() == set()
    assert {"cronlock_consecutive_skips", "cronlock_leader"} <= names


def test_the_operator_down_alert_fires_when_no_replica_leads_on_prometheus_engine(
    controlplane: ControlPlane, tmp_path: Path
) -> None:
    on = ["--set", "prometheusRule.enabled=true", "--api-versions", "monitoring.coreos.com/v1"]
    expr = alert_expr(rule_file(tmp_path, render(controlplane, *on)), "CronlockOperatorDown")
    # The series as the ServiceMonitor's scrape labels them: the selector's own matchers.
    [job] = re.findall(r"cronlock_leader\{([^}]*)\}", expr)
    script = f"""
load 1m
  cronlock_leader{{{job},pod="a"}} 1x5 0x5 _x5
  cronlock_leader{{{job},pod="b"}} 0x10 1x5

# A leader and a waiting replica: quiet.
eval instant at 3m {expr}

# Both scraped, neither leads (minute 6 to 10): fires.
eval instant at 8m {expr}
  {{}} 1

# The other replica took over: quiet again.
eval instant at 13m {expr}

# Nothing scraped at all: fires (absent of every series).
eval instant at 40m {expr}
  {{}} 1
"""
    ran = promql_eval(tmp_path, script)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.startswith("PASS"), ran.stdout
    # The engine can disagree: a wrong expectation fails.
    wrong = promql_eval(tmp_path, script.replace("eval instant at 3m", "eval instant at 8m", 1))
    assert wrong.returncode != 0


def test_the_missed_run_alerts_fire_on_prometheus_engine(
    controlplane: ControlPlane, tmp_path: Path
) -> None:
    on = ["--set", "prometheusRule.enabled=true", "--api-versions", "monitoring.coreos.com/v1"]
    rules = rule_file(tmp_path, render(controlplane, *on))
    missed = alert_expr(rules, "CronlockRunsMissed")
    failing = alert_expr(rules, "CronlockNotSucceeding")
    # Two replicas scraped: only the leader judges ticks, the other exports nothing.
    job = 'job="cronlock-metrics",namespace="cronlock-system",cronjob="report"'
    script = f"""
load 1m
  cronlock_missed_runs_total{{{job},pod="a"}} 0x10 1x20
  cronlock_not_succeeding{{{job},pod="a"}} 0x10 1x5 0x5

# Before the miss: quiet.
eval instant at 9m count({missed})

# A tick missed at minute 11: fires (one series) for the window (15m) after it.
eval instant at 12m count({missed})
  {{}} 1

eval instant at 27m count({missed})

# NotSucceeding while the operator says so, per CronJob.
eval instant at 5m {failing}

eval instant at 12m {failing}
  {{namespace="cronlock-system", cronjob="report"}} 1

eval instant at 17m {failing}
"""
    ran = promql_eval(tmp_path, script)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.startswith("PASS"), ran.stdout
    wrong = promql_eval(tmp_path, script.replace("eval instant at 9m", "eval instant at 12m", 1))
    assert wrong.returncode != 0


def test_every_alert_about_a_namespace_keeps_it_on_prometheus_engine(
    controlplane: ControlPlane, tmp_path: Path
) -> None:
    """Alertmanager routes by the namespace (and the lock): two teams' series fire apart."""
    on = ["--set", "prometheusRule.enabled=true", "--api-versions", "monitoring.coreos.com/v1"]
    rules = rule_file(tmp_path, render(controlplane, *on))
    cleared = alert_expr(rules, "CronlockExpiredHoldCleared")
    unguarded = alert_expr(rules, "CronlockCronJobsNotGuarded")
    errors = alert_expr(rules, "CronlockReconcileErrors")
    # As the ServiceMonitor scrapes them (honorLabels): two replicas, the leader exports.
    job = 'job="cronlock-metrics",pod="a"'
    script = f"""
load 1m
  cronlock_takeovers_total{{{job},namespace="team-a",lock="ledger",reason="expired"}} 0x10 1x20
  cronlock_takeovers_total{{{job},namespace="team-b",lock="report",reason="expired"}} 0x30
  cronlock_cronjobs{{{job},namespace="team-a",state="conflict"}} 0x30
  cronlock_cronjobs{{{job},namespace="team-b",state="conflict"}} 0x5 2x25
  cronlock_cronjobs{{{job},namespace="team-b",state="guarded"}} 3x30
  cronlock_reconcile_errors_total{{{job},namespace="team-a",kind="cronjob"}} 0+1x30
  cronlock_reconcile_errors_total{{{job},namespace="team-b",kind="cronjob"}} 0x30

# A hold cleared in team-a at minute 11: its lock alone.
eval instant at 12m {cleared}
  {{namespace="team-a", lock="ledger"}} 1

# Two CronJobs of team-b in conflict from minute 6; team-a's and the guarded ones quiet.
eval instant at 8m {unguarded}
  {{namespace="team-b", state="conflict"}} 2

# team-a fails a reconcile a minute: 15 in the window, over the threshold (5).
eval instant at 20m {errors}
  {{namespace="team-a"}} 15
"""
    ran = promql_eval(tmp_path, script)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.startswith("PASS"), ran.stdout
    wrong = promql_eval(tmp_path, script.replace('namespace="team-a", lock', "lock", 1))
    assert wrong.returncode != 0


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


def test_the_pod_monitor_scrapes_the_port_the_injection_gives_every_sidecar(
    controlplane: ControlPlane,
) -> None:
    from cronlock_operator.cronjob.config import parse_config
    from cronlock_operator.injection.build import desired_cronjob
    from cronlock_sidecar import contract
    from tests.support.cronjobs import SETTINGS, make_cronjob

    api = ["--api-versions", "monitoring.coreos.com/v1"]
    assert "PodMonitor" not in kinds(render(controlplane, *api))
    assert "PodMonitor" not in kinds(render(controlplane, "--set", "podMonitor.enabled=true"))
    [monitor] = [
        doc
        for doc in render(controlplane, *api, "--set", "podMonitor.enabled=true")
        if doc["kind"] == "PodMonitor"
    ]
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    assert monitor["spec"]["selector"]["matchExpressions"] == [
        {"key": "cronlock.io/lock", "operator": "Exists"}
    ]
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    # The name the injection gives the sidecar's port, on the label it gives the pods.
    cronjob = make_cronjob()
    template = desired_cronjob(cronjob, parse_config(cronjob, SETTINGS), SETTINGS)["spec"][
        "jobTemplate"
    ]["spec"]["template"]
    assert "cronlock.io/lock" in template["metadata"]["labels"]
    [sidecar] = [
        container
        for container in template["spec"]["initContainers"]
        if container["name"] == contract.SIDECAR_CONTAINER
    ]
    [port] = sidecar["ports"]
    assert (endpoint["port"], endpoint["path"]) == (port["name"], "/metrics")
    watching = ("--set", "podMonitor.enabled=true,podMonitor.namespace=monitoring")
    docs = render(controlplane, *api, *watching, "--set", "watchNamespaces={team-a,team-b}")
    [watched] = [doc for doc in docs if doc["kind"] == "PodMonitor"]
    assert watched["metadata"]["namespace"] == "monitoring"
    assert watched["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_the_pod_monitor_keeps_only_the_sidecars_series_within_limits(
    controlplane: ControlPlane,
) -> None:
    """L-N13: the PodMonitor scrapes any pod labelled cronlock.io/lock with a port named
    `cronlock`, which anyone who may create a pod in a watched namespace can make. A
    sidecar's whole exposition, every family with a sample, is kept and well within the
    limits; the operator's series the alerts read, or anything else such a pod serves, is
    dropped (Prometheus anchors the regex: a full match), and a scrape of more samples or
    labels than the limits is dropped whole by Prometheus."""
    from cronlock_sidecar.pod.state import SidecarState

    api = ["--api-versions", "monitoring.coreos.com/v1"]
    docs = render(
        controlplane, *api, "--set", "podMonitor.enabled=true,prometheusRule.enabled=true"
    )
    [monitor] = [doc for doc in docs if doc["kind"] == "PodMonitor"]
    [rule] = [doc for doc in docs if doc["kind"] == "PrometheusRule"]
    spec = monitor["spec"]
    assert (spec["sampleLimit"], spec["labelLimit"]) == (100, 16)
    [endpoint] = spec["podMetricsEndpoints"]
    [keep] = endpoint["metricRelabelings"]
    assert (keep["sourceLabels"], keep["action"]) == (["__name__"], "keep")
    kept = re.compile(keep["regex"])
    # The sidecar's own, after an acquire, renewals of each result, a loss and a release.
    state = SidecarState()
    state.update(held=True, decision="acquired", fencing_token=7)
    for result in ("renewed", "conflict", "error"):
        state.count_renewal(result, at=0.0)
    state.count_lost()
    state.count_release("released")
    samples = [line for line in state.metrics().splitlines() if not line.startswith("#")]
    names = {line.split("{")[0].split(" ")[0] for line in samples}
    assert len(names) >= 6, names
    assert all(kept.fullmatch(name) for name in names), names
    assert len(samples) * 4 <= spec["sampleLimit"], len(samples)
    # __name__, the sample's own labels and the six prometheus-operator gives every target
    # (job, instance, namespace, pod, container, endpoint).
    assert max(1 + 6 + line.count('="') for line in samples) * 2 <= spec["labelLimit"]
    # What a labelled pod of someone else's could add: the operator's series, which the
    # alerts read, and anything else.
    forged = set(re.findall(r"\bcronlock_[a-z_]+", yaml.safe_dump(rule["spec"])))
    assert {"cronlock_leader", "cronlock_takeovers_total"} <= forged
    assert not [name for name in forged if kept.fullmatch(name)]
    for other in ("process_cpu_seconds_total", "xcronlock_sidecar_held", "up"):
        assert not kept.fullmatch(other), other
    # Each is the user's to set: 0 lifts a limit; the schema refuses a negative one, or
    # an empty keep.
    mine = ("--set", "podMonitor.enabled=true,podMonitor.sampleLimit=0,podMonitor.labelLimit=40")
    [lifted] = [doc for doc in render(controlplane, *api, *mine) if doc["kind"] == "PodMonitor"]
    assert "sampleLimit" not in lifted["spec"]
    assert lifted["spec"]["labelLimit"] == 40
    for bad in ("podMonitor.sampleLimit=-1", "podMonitor.keepMetrics=", "podMonitor.labelLimit=x"):
        refused = helm(
            controlplane, "template", "cronlock", str(CHART), *api,
            "--set", "podMonitor.enabled=true", "--set", bad, check=False,
        )  # fmt: skip
        assert refused.returncode != 0, bad
        assert "podMonitor" in refused.stderr, (bad, refused.stderr)


def test_the_prometheus_rule_goes_where_it_is_asked_with_labels_and_alerts_left_out(
    controlplane: ControlPlane, tmp_path: Path
) -> None:
    on = ["--set", "prometheusRule.enabled=true", "--api-versions", "monitoring.coreos.com/v1"]
    docs = render(
        controlplane,
        *on,
        "--set", "prometheusRule.namespace=monitoring",
        "--set", "prometheusRule.alertLabels.team=platform",
        "--set", "prometheusRule.alertLabels.cluster=prod-eu",
        "--set", "prometheusRule.disabled.CronlockRunsMissed=true",
        "--set", "prometheusRule.disabled.CronlockOperatorDown=true",
    )  # fmt: skip
    [rule] = [doc for doc in docs if doc["kind"] == "PrometheusRule"]
    assert rule["metadata"]["namespace"] == "monitoring"
    alerts = {alert["alert"]: alert for alert in rule["spec"]["groups"][0]["rules"]}
    assert "CronlockRunsMissed" not in alerts
    assert "CronlockOperatorDown" not in alerts
    assert len(alerts) == 5
    for name, alert in alerts.items():
        assert alert["labels"]["team"] == "platform", name
        assert alert["labels"]["cluster"] == "prod-eu", name
        assert alert["labels"]["severity"], name
    checked = rulecheck(rule_file(tmp_path, docs))
    assert checked.returncode == 0, checked.stderr
    assert "1 groups, 5 rules" in checked.stdout
    # A label the alerts set themselves, or an alert that does not exist, is refused.
    for bad in ("prometheusRule.alertLabels.namespace=x", "prometheusRule.disabled.Nope=true"):
        refused = helm(
            controlplane, "template", "cronlock", str(CHART), *on, "--set", bad, check=False
        )
        assert refused.returncode != 0, bad
        assert "values don't meet the specifications of the schema" in refused.stderr, bad


KUBE_JOB_FAILED = Path(__file__).resolve().parents[2] / "manifests/prometheus/kube-job-failed.yaml"


def test_the_documented_kube_job_failed_rule_leaves_out_only_cronlocks_failed_jobs(
    tmp_path: Path,
) -> None:
    from cronlock_sidecar import contract

    rule = yaml.safe_load(KUBE_JOB_FAILED.read_text())
    path = tmp_path / "kube-job-failed.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    checked, names = metrics_named(path)
    assert checked.returncode == 0, checked.stderr
    assert names == {"kube_job_failed", "kube_job_labels"}
    # kube-state-metrics' name for the label: label_ and the key with [^a-zA-Z0-9_] as _.
    exported = "label_" + re.sub(r"[^a-zA-Z0-9_]", "_", contract.LABEL_OUTCOME)
    expr = alert_expr(path, "KubeJobFailed")
    assert f'{exported}=~"{"|".join(contract.LABELLED_OUTCOMES)}"' in expr

    ksm = 'job="kube-state-metrics"'

    def failed(namespace: str, job: str) -> str:
        return f'kube_job_failed{{{ksm},condition="true",namespace="{namespace}",job_name="{job}"}}'

    def labels(namespace: str, job: str, value: str = "") -> str:
        label = f',{exported}="{value}"' if value else ""
        return f'kube_job_labels{{{ksm},namespace="{namespace}",job_name="{job}"{label}}}'

    script = f"""
load 1m
  {failed("shop", "work-1")} 1x20
  {failed("shop", "skip-1")} 1x20
  {failed("shop", "gone-1")} 1x20
  {failed("other", "skip-1")} 1x20
  {labels("shop", "work-1")} 1x20
  {labels("shop", "skip-1", "skipped")} 1x20
  {labels("shop", "gone-1", "replaced")} 1x20
  {labels("other", "skip-1")} 1x20

# kube-prometheus' own rule: every Failed Job.
eval instant at 16m kube_job_failed{{{ksm}}} > 0
  {failed("shop", "work-1")} 1
  {failed("shop", "skip-1")} 1
  {failed("shop", "gone-1")} 1
  {failed("other", "skip-1")} 1

# The documented one: the work's own failures, in any namespace, and nothing of cronlock's.
eval instant at 16m {expr}
  {failed("shop", "work-1")} 1
  {failed("other", "skip-1")} 1
"""
    ran = promql_eval(tmp_path, script)
    assert ran.returncode == 0, ran.stdout + ran.stderr


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


def test_helm_tests_account_may_only_list_endpointslices_and_its_pod_is_no_operator(
    controlplane: ControlPlane,
) -> None:
    docs = render(controlplane, tests=True)
    hooks = [d for d in docs if (d["metadata"].get("annotations") or {}).get("helm.sh/hook")]
    assert kinds(hooks) == ["Pod", "Role", "RoleBinding", "ServiceAccount"]
    [role] = [d for d in hooks if d["kind"] == "Role"]
    assert role["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]}
    ]
    [pod] = [d for d in hooks if d["kind"] == "Pod"]
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    labels = pod["metadata"]["labels"]
    assert not selector.items() <= labels.items(), "the test pod would count as the operator"
    [container] = pod["spec"]["containers"]
    assert container["args"] == [
        "--check-metrics",
        f"{pod['metadata']['namespace']}/cronlock-metrics",
        "--check-wait",
        "60s",
    ]
    assert pod["spec"]["serviceAccountName"] == role["metadata"]["name"]
    # What the operator's own pod has: restricted Pod Security (dry-run-admitted elsewhere).
    template = deployment["spec"]["template"]["spec"]
    assert pod["spec"]["securityContext"] == template["securityContext"]
    assert container["securityContext"] == template["containers"][0]["securityContext"]
    for off in ("tests.enabled=false", "metrics.enabled=false"):
        rendered = render(controlplane, "--set", off, tests=True)
        assert not any(d["metadata"]["name"].endswith("-test") for d in rendered), off


def test_the_mutating_policy_is_rendered_only_where_served_and_bound_to_the_watch(
    controlplane: ControlPlane,
) -> None:
    served = ("--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy")
    policy = {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}
    assert policy <= set(kinds(render(controlplane, *served)))
    assert not policy & set(kinds(render(controlplane)))  # before 1.36: not served
    off = render(controlplane, *served, "--set", "admissionPolicy.onFailureToNever=false")
    assert not policy & set(kinds(off))
    scoped = render(controlplane, *served, "--set", "watchNamespaces={reports,exports}")
    [binding] = [doc for doc in scoped if doc["kind"] == "MutatingAdmissionPolicyBinding"]
    [term] = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert term == {
        "key": "kubernetes.io/metadata.name",
        "operator": "In",
        "values": ["reports", "exports"],
    }


def test_the_servicemonitor_is_rendered_only_when_enabled_and_its_api_is_served(
    controlplane: ControlPlane,
) -> None:
    enabled = ["--set", "serviceMonitor.enabled=true"]
    api = ["--api-versions", "monitoring.coreos.com/v1"]

    assert "ServiceMonitor" in kinds(render(controlplane, *enabled, *api))
    [monitor] = [
        doc for doc in render(controlplane, *enabled, *api) if doc["kind"] == "ServiceMonitor"
    ]
    # The series' own `namespace` label (the CronJob's) is kept, not renamed exported_namespace.
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    assert monitor["metadata"]["namespace"] == "default"
    assert set(monitor["spec"]["endpoints"][0]) == {"port", "path", "honorLabels", "interval"}
    drop = {"action": "drop", "regex": "cronlock_consecutive_skips", "sourceLabels": ["__name__"]}
    [tuned] = [
        doc
        for doc in render(
            controlplane,
            *enabled,
            *api,
            "--set",
            "serviceMonitor.namespace=monitoring,serviceMonitor.scrapeTimeout=10s",
            "--set-json",
            f"serviceMonitor.metricRelabelings=[{json.dumps(drop)}]",
            "--set-json",
            'serviceMonitor.relabelings=[{"action": "labeldrop", "regex": "pod"}]',
        )
        if doc["kind"] == "ServiceMonitor"
    ]
    assert tuned["metadata"]["namespace"] == "monitoring"
    # It still selects the operator's Service where the release is.
    assert tuned["spec"]["namespaceSelector"] == {"matchNames": ["default"]}
    [endpoint] = tuned["spec"]["endpoints"]
    assert endpoint["scrapeTimeout"] == "10s"
    assert endpoint["metricRelabelings"] == [drop]
    assert endpoint["relabelings"] == [{"action": "labeldrop", "regex": "pod"}]
    assert "ServiceMonitor" not in kinds(render(controlplane, *enabled))
    assert "ServiceMonitor" not in kinds(render(controlplane, *api))


def test_watch_namespaces_swap_the_cluster_role_binding_for_role_bindings(
    controlplane: ControlPlane,
) -> None:
    """The namespaced grants; the read of namespaces (namespaceOptIn) is cluster-wide in
    both, bound on its own, and gone with namespaceOptIn=false."""
    cluster = render(controlplane)
    scoped = render(controlplane, "--set-json", 'watchNamespaces=["team-a","team-b"]')
    scoped_only = render(
        controlplane,
        "--set-json",
        'watchNamespaces=["team-a","team-b"]',
        "--set",
        "namespaceOptIn=false",
    )

    def cluster_bindings(docs: list[dict[str, Any]]) -> list[str]:
        return sorted(d["roleRef"]["name"] for d in docs if d["kind"] == "ClusterRoleBinding")

    def role_bindings(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
        """RoleBindings to a ClusterRole (the watch's) or to a Role (its own Deployment's)."""
        return [d for d in docs if d["kind"] == "RoleBinding" and d["roleRef"]["kind"] == kind]

    assert cluster_bindings(cluster) == ["cronlock-default", "cronlock-default-namespaces"]
    assert not role_bindings(cluster, "ClusterRole")
    # In both, the read of its own Deployment, in its own namespace.
    for docs in (cluster, scoped):
        [own] = role_bindings(docs, "Role")
        assert own["roleRef"]["name"] == "cronlock-self"
    assert cluster_bindings(scoped) == ["cronlock-default-namespaces"]
    assert "ClusterRoleBinding" not in kinds(scoped_only)
    [reads] = [
        d
        for d in scoped
        if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-namespaces")
    ]
    assert reads["rules"] == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]}
    ]
    bindings = role_bindings(scoped, "ClusterRole")
    assert sorted(doc["metadata"]["namespace"] for doc in bindings) == ["team-a", "team-b"]


def test_a_release_whose_watch_overlaps_another_is_refused_and_disjoint_ones_coexist(
    controlplane: ControlPlane, namespace: str, extra_namespace: Callable[[], str]
) -> None:
    # The same release name in two namespaces: once collided on every cluster-scoped name.
    other, team_x, team_y = extra_namespace(), extra_namespace(), extra_namespace()
    release = f"cl-{secrets.token_hex(3)}"

    def install(where: str, *watch: str, verb: str = "install") -> subprocess.CompletedProcess[str]:
        scope = ("--set-json", f"watchNamespaces={json.dumps(list(watch))}") if watch else ()
        return helm(
            controlplane,
            verb,
            release,
            str(CHART),
            "-n",
            where,
            "--wait=false",
            *scope,
            check=False,
        )

    first = install(namespace, team_x)
    assert first.returncode == 0, first.stderr
    try:
        everywhere = install(other)
        assert everywhere.returncode != 0
        assert (
            f'cronlock release "{release}" in namespace {namespace} already runs an operator '
            f"watching {team_x}; this release would watch {team_x} too"
        ) in everywhere.stderr
        assert "Give each release disjoint watchNamespaces" in everywhere.stderr

        disjoint = install(other, team_y)
        assert disjoint.returncode == 0, disjoint.stderr
        roles = controlplane.kubectl("get", "clusterrole", "-o", "name").split()
        assert {
            f"clusterrole.rbac.authorization.k8s.io/{release}-cronlock-{namespace}",
            f"clusterrole.rbac.authorization.k8s.io/{release}-cronlock-{other}",
        } <= set(roles)

        # A release's own upgrade is not refused by itself; one onto the other's is.
        assert install(namespace, team_x, verb="upgrade").returncode == 0
        onto = install(other, team_y, team_x, verb="upgrade")
        assert onto.returncode != 0
        assert f"this release would watch {team_x} too" in onto.stderr
    finally:
        for where in (namespace, other):
            helm(controlplane, "uninstall", release, "-n", where, check=False)


@pytest.mark.parametrize(
    ("enabled", "holders", "rendered"),
    [(True, True, True), (False, True, True), (True, False, True), (False, False, False)],
)
def test_freezes_are_guarded_whenever_either_lease_policy_is_on(
    controlplane: ControlPlane, enabled: bool, holders: bool, rendered: bool
) -> None:
    """Security review L9: with the operator's policy off but the holders' on, a pod on the
    account could write any freeze; the freeze and freezers' policies and the freezer role
    now come with either policy (and with neither, no freezer role is offered)."""
    docs = render(
        controlplane,
        "--set",
        f"admissionPolicy.enabled={str(enabled).lower()}",
        "--set",
        f"admissionPolicy.holders={str(holders).lower()}",
    )
    names = {doc["metadata"]["name"] for doc in docs}
    expected = {
        "cronlock-default-lease-freeze",
        "cronlock-default-freezers",
        "cronlock-default-freezer",
    }
    assert (expected <= names) is rendered, sorted(names)
    if not rendered:
        assert not expected & names


def test_a_watched_namespace_that_does_not_exist_is_named_with_what_to_do(
    controlplane: ControlPlane, namespace: str
) -> None:
    """Not helm's bare `namespaces "x" not found` from the RoleBinding, half-installed."""
    release = f"cl-{secrets.token_hex(3)}"
    missing = f"nowhere-{secrets.token_hex(3)}"
    result = helm(
        controlplane,
        "install",
        release,
        str(CHART),
        "-n",
        namespace,
        "--wait=false",
        "--set-json",
        f'watchNamespaces=["{namespace}", "{missing}"]',
        check=False,
    )
    try:
        assert result.returncode != 0
        assert f"watchNamespaces names {missing}, which does not exist in this cluster" in (
            result.stderr
        )
        assert f"kubectl create namespace {missing}" in result.stderr
        listed = helm(controlplane, "list", "-n", namespace, "-q").stdout.split()
        assert release not in listed
    finally:
        helm(controlplane, "uninstall", release, "-n", namespace, check=False)


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


# --- manifests ----------------------------------------------------------------------------
def test_manifests_install_yaml_is_its_namespace_and_the_chart_rendered_with_defaults(
    controlplane: ControlPlane,
) -> None:
    checked_in = INSTALL_YAML.read_text()
    header, namespace, rendered = checked_in.split("---\n", 2)
    fresh = helm(
        controlplane,
        "template",
        "cronlock",
        "charts/cronlock",
        "--namespace",
        "cronlock-system",
        # `helm test`'s Pod is no part of an install: kubectl would run it at once.
        "--skip-tests",
    ).stdout

    assert header.strip(), "manifests/install.yaml lost its header comment"
    assert all(line.startswith("#") for line in header.splitlines())
    # `kubectl apply -f` alone works: the namespace comes first, restricted like the chart's.
    assert yaml.safe_load(namespace) == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": "cronlock-system",
            "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/warn": "restricted",
            },
        },
    }
    assert "---\n" + rendered == fresh, (
        f"manifests/install.yaml is stale; regenerate it from the repository root with:\n"
        f"  {REGENERATE}"
    )


@pytest.mark.timeout(240)
def test_kubectl_apply_of_install_yaml_alone_installs_and_delete_removes_it(
    controlplane: ControlPlane, tmp_path: Path
) -> None:
    # The file as shipped, but for a namespace of its own: cronlock-system here is the
    # other tests' operator's, which a `kubectl delete -f` would take with it. Nothing is
    # made by hand first: the file brings its namespace.
    space = f"cl-install-{secrets.token_hex(3)}"
    text = INSTALL_YAML.read_text()
    assert text.count("cronlock-system") > 10
    manifest = tmp_path / "install.yaml"
    manifest.write_text(text.replace("cronlock-system", space))
    try:
        applied = controlplane.kubectl("apply", "-f", str(manifest))
        assert f"namespace/{space} created" in applied
        assert "deployment.apps/cronlock created" in applied
        assert f"clusterrole.rbac.authorization.k8s.io/cronlock-{space} created" in applied
        labels = controlplane.kubectl(
            "get", "namespace", space, "-o", "jsonpath={.metadata.labels}"
        )
        assert '"pod-security.kubernetes.io/enforce":"restricted"' in labels
        assert controlplane.kubectl("get", "deployment", "cronlock", "-n", space, "-o", "name")
    finally:
        controlplane.kubectl(
            "delete", "-f", str(manifest), "--ignore-not-found", "--wait", "--timeout=180s"
        )
    assert space not in controlplane.kubectl("get", "namespace", "-o", "name")
    assert f"cronlock-{space}" not in controlplane.kubectl("get", "clusterrole", "-o", "name")


# --- install into the API server ---------------------------------------------------------
def test_pod_security_admission_refuses_a_pod_that_is_not_restricted(
    controlplane: ControlPlane, namespace: str
) -> None:
    label_restricted(controlplane, namespace)
    template = {"spec": {"containers": [{"name": "main", "image": "busybox:1.37"}]}}

    with pytest.raises(AssertionError, match="violates PodSecurity"):
        dry_run_pod(controlplane, namespace, template)


def test_install_with_default_values(
    controlplane: ControlPlane, namespace: str, install: Install
) -> None:
    release = install()
    fullname = f"{release}-cronlock"

    deployment = json.loads(
        controlplane.kubectl("get", "deployment", fullname, "-n", namespace, "-o", "json")
    )
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == fullname
    env = deployment_env(deployment)
    assert env["CRONLOCK_SIDECAR_IMAGES_FROM"] == f"{namespace}/{fullname}"
    assert images_from(deployment) == (
        "ghcr.io/cronlock/cronlock-sidecar:0.1.0",
        "ghcr.io/cronlock/cronlock-sidecar-stores:0.1.0",
    )
    assert env["CRONLOCK_NAMESPACES"] == ""
    assert "CRONLOCK_DEFAULT_RENEW" not in env
    binding = json.loads(
        controlplane.kubectl("get", "clusterrolebinding", f"{fullname}-{namespace}", "-o", "json")
    )
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": fullname, "namespace": namespace}
    ]
    controlplane.kubectl("get", "serviceaccount", fullname, "-n", namespace)
    service = json.loads(
        controlplane.kubectl("get", "service", f"{fullname}-metrics", "-n", namespace, "-o", "json")
    )
    assert [(port["port"], port["targetPort"]) for port in service["spec"]["ports"]] == [
        (8080, "metrics")
    ]
    dry_run_pod(controlplane, namespace, deployment["spec"]["template"])


def test_only_the_operator_container_gets_the_service_account_token(
    controlplane: ControlPlane, namespace: str, install: Install
) -> None:
    """L-N8: the init containers run the sidecar images (by tag in the defaults); with the
    pod-level automount they had the operator's token, and with it its cluster-wide read of
    CronJobs and Jobs. The pod the ReplicaSet creates, as the API server admits it
    (ServiceAccount admission, PodSecurity restricted): the token, the CA and the namespace
    in the operator container alone, at the path its in-cluster config reads."""
    from kubernetes.config import incluster_config

    from cronlock_operator.kube import client

    release = install()
    deployment = json.loads(
        controlplane.kubectl(
            "get", "deployment", f"{release}-cronlock", "-n", namespace, "-o", "json"
        )
    )
    template = deployment["spec"]["template"]
    assert template["spec"]["automountServiceAccountToken"] is False
    pod = json.loads(dry_run_pod(controlplane, namespace, template, "-o", "json"))
    account = Path(incluster_config.SERVICE_TOKEN_FILENAME).parent
    assert account / "namespace" == client._SERVICE_ACCOUNT_NAMESPACE

    def secret_mounts(container: dict[str, Any]) -> list[str]:
        return [
            mount["mountPath"]
            for mount in container.get("volumeMounts", [])
            if mount["mountPath"].startswith("/var/run/secrets")
        ]

    inits = pod["spec"]["initContainers"]
    assert [init["name"] for init in inits] == ["sidecar-image", "sidecar-stores-image"]
    assert [secret_mounts(init) for init in inits] == [[], []]
    [operator] = pod["spec"]["containers"]
    assert secret_mounts(operator) == [str(account)]
    [mount] = [m for m in operator["volumeMounts"] if m["mountPath"] == str(account)]
    assert mount["readOnly"] is True
    volumes = {volume["name"]: volume for volume in pod["spec"]["volumes"]}
    assert not [name for name in volumes if name.startswith("kube-api-access-")]  # no automount
    files: dict[str, str] = {}
    for source in volumes[mount["name"]]["projected"]["sources"]:
        if "serviceAccountToken" in source:
            files[source["serviceAccountToken"]["path"]] = "token"
            assert source["serviceAccountToken"].get("audience") is None  # the API server's
        for item in (source.get("configMap") or {}).get("items", []):
            files[item["path"]] = f"{source['configMap']['name']}/{item['key']}"
        for item in (source.get("downwardAPI") or {}).get("items", []):
            files[item["path"]] = item["fieldRef"]["fieldPath"]
    assert files == {
        Path(incluster_config.SERVICE_TOKEN_FILENAME).name: "token",
        Path(incluster_config.SERVICE_CERT_FILENAME).name: "kube-root-ca.crt/ca.crt",
        "namespace": "metadata.namespace",
    }
    # The template as it was (automount on the pod): the API server mounts the token into
    # both init containers, which is what this check sees.
    before = json.loads(json.dumps(template))
    before["spec"]["automountServiceAccountToken"] = True
    admitted = json.loads(dry_run_pod(controlplane, namespace, before, "-o", "json"))
    assert [secret_mounts(init) for init in admitted["spec"]["initContainers"]] == [
        [str(account)],
        [str(account)],
    ]


def test_install_with_non_default_values(
    controlplane: ControlPlane,
    namespace: str,
    install: Install,
    extra_namespace: Callable[[], str],
) -> None:
    other = extra_namespace()
    release = install({**NON_DEFAULT, "watchNamespaces": [namespace, other]})
    fullname = f"{release}-lock"

    deployment = json.loads(
        controlplane.kubectl("get", "deployment", fullname, "-n", namespace, "-o", "json")
    )
    env = deployment_env(deployment)
    assert env["CRONLOCK_NAMESPACES"] == f"{namespace},{other}"
    assert env["CRONLOCK_LOG_FORMAT"] == "json"
    assert env["CRONLOCK_DEFAULT_RENEW"] == "30s"
    pod = deployment["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == "cronlock-operator"
    assert pod["metadata"]["labels"]["example.com/team"] == "ops"
    assert pod["spec"]["containers"][0]["image"] == (
        "registry.example.com/platform/cronlock:0.1.0-rc.1"
    )
    # The init containers that name the images to inject ask what the operator asks: the
    # pod's request is unchanged, and a quota that wants limits admits them alike.
    [operator] = pod["spec"]["containers"]
    assert operator["resources"]["limits"]["memory"] == "128Mi"  # NON_DEFAULT's
    inits = pod["spec"]["initContainers"]
    assert [init["name"] for init in inits] == ["sidecar-image", "sidecar-stores-image"]
    for init in inits:
        assert init["resources"] == operator["resources"]
        assert init["securityContext"] == operator["securityContext"]
        assert init["imagePullPolicy"] == "Always"
    for space in (namespace, other):
        binding = json.loads(
            controlplane.kubectl("get", "rolebinding", fullname, "-n", space, "-o", "json")
        )
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": f"{fullname}-{namespace}",
        }
    assert "not found" in controlplane.kubectl(
        "get", "clusterrolebinding", f"{fullname}-{namespace}", check=False
    )
    manifest = helm(controlplane, "get", "manifest", release, "-n", namespace).stdout
    assert "kind: ServiceMonitor" not in manifest  # the API is not served here
    notes = helm(controlplane, "get", "notes", release, "-n", namespace).stdout
    assert "no ServiceMonitor was created" in notes
    dry_run_pod(controlplane, namespace, pod)


# --- RBAC, acting as the chart's ServiceAccount ------------------------------------------
def test_the_service_account_may_do_exactly_what_the_operator_does_everywhere(
    controlplane: ControlPlane,
    namespace: str,
    install: Install,
    service_account_kubeconfig: ServiceAccountKubeconfig,
) -> None:
    release = install()
    client = controlplane.api_client(service_account_kubeconfig(namespace, f"{release}-cronlock"))

    for space in (namespace, "some-other-namespace"):
        for (group, resource), verbs in GRANTED.items():
            for verb in VERBS:
                allowed = can(client, verb, group, resource, namespace=space)
                assert allowed == (verb in verbs), f"{verb} {group}/{resource} in {space}"
    # kopf watches CronJobs, Jobs and Leases across namespaces in one request each.
    for group, resource in (
        ("batch", "cronjobs"),
        ("batch", "jobs"),
        ("coordination.k8s.io", "leases"),
    ):
        assert can(client, "watch", group, resource)
    for verb in VERBS:
        assert can(client, verb, "", "namespaces") == (verb in NAMESPACES_GRANTED), verb
    # Its own Deployment, to read the images it injects from its init containers: get alone.
    fullname = f"{release}-cronlock"
    for verb in VERBS:
        mine = can(client, verb, "apps", "deployments", namespace=namespace, name=fullname)
        assert mine == (verb == "get"), verb
    assert not can(client, "get", "apps", "deployments", namespace=namespace, name="other")
    for verb, group, resource, namespaced in REFUSED:
        where = {"namespace": namespace} if namespaced else {}
        assert not can(client, verb, group, resource, **where), f"{verb} {group}/{resource}"


def test_with_watch_namespaces_the_service_account_may_act_only_there(
    controlplane: ControlPlane,
    namespace: str,
    install: Install,
    extra_namespace: Callable[[], str],
    service_account_kubeconfig: ServiceAccountKubeconfig,
) -> None:
    """And with namespaceOptIn off, nothing cluster-scoped at all: not even reading
    namespaces."""
    other = extra_namespace()
    release = install({"watchNamespaces": [namespace, other], "namespaceOptIn": False})
    client = controlplane.api_client(service_account_kubeconfig(namespace, f"{release}-cronlock"))

    for (group, resource), verbs in GRANTED.items():
        for verb in VERBS:
            for space in (namespace, other):
                allowed = can(client, verb, group, resource, namespace=space)
                assert allowed == (verb in verbs), f"{verb} {group}/{resource} in {space}"
            assert not can(client, verb, group, resource, namespace="unwatched")
        assert not can(client, "list", group, resource)  # cluster-wide
    for verb in VERBS:
        assert not can(client, verb, "", "namespaces"), verb
    for verb, group, resource, namespaced in REFUSED:
        where = {"namespace": namespace} if namespaced else {}
        assert not can(client, verb, group, resource, **where), f"{verb} {group}/{resource}"


@pytest.mark.timeout(180)
def test_the_operator_as_the_charts_service_account_injects_and_reverts(
    controlplane: ControlPlane,
    api: kubernetes.client.ApiClient,
    namespace: str,
    install: Install,
    service_account_kubeconfig: ServiceAccountKubeconfig,
    tmp_path: Path,
) -> None:
    release = install({"watchNamespaces": [namespace]})
    kubeconfig = service_account_kubeconfig(namespace, f"{release}-cronlock")
    cronjob = yaml.safe_load((ROOT / "manifests" / "examples" / "basic.yaml").read_text())
    batch = kubernetes.client.BatchV1Api(api)
    batch.create_namespaced_cron_job(namespace, cronjob)
    log_path = tmp_path / "operator.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "cronlock-operator"),
                "--namespace",
                namespace,
                "--metrics-port",
                "0",
                "--liveness",
                "",
            ],
            env={**controlplane.env, "KUBECONFIG": str(kubeconfig)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def template() -> dict[str, Any]:
            body = batch.read_namespaced_cron_job("report", namespace)
            result: dict[str, Any] = api.sanitize_for_serialization(body)
            return result["spec"]["jobTemplate"]["spec"]["template"]

        def init_names() -> list[str]:
            return [c["name"] for c in template()["spec"].get("initContainers") or []]

        wait_for(lambda: "cronlock" in init_names(), 60, "the operator to inject the CronJob")
        lease = controlplane.kubectl("get", "lease", "cronlock-report", "-n", namespace)
        assert "cronlock-report" in lease
        assert "cronlock-holder" in controlplane.kubectl("get", "role", "-n", namespace)
        # The injected pod too passes restricted pod security.
        label_restricted(controlplane, namespace)
        dry_run_pod(controlplane, namespace, template())

        controlplane.kubectl(
            "annotate", "cronjob", "report", "-n", namespace, "cronlock.io/enabled-"
        )
        wait_for(lambda: not init_names(), 60, "the operator to revert the CronJob")
        events = controlplane.kubectl("get", "events", "-n", namespace)
        assert "Injected" in events
        assert "Reverted" in events
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    output = log_path.read_text(errors="replace")
    # Without the lines' timestamps, whose milliseconds can read 403 too.
    messages = re.sub(r"(?m)^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", "", output)
    assert "403" not in messages, output[-3000:]
    assert "Forbidden" not in messages, output[-3000:]


# --- examples -------------------------------------------------------------------------------
@pytest.mark.parametrize("example", EXAMPLES, ids=[path.stem for path in EXAMPLES])
def test_the_example_is_accepted_in_a_restricted_namespace(
    controlplane: ControlPlane, namespace: str, example: Path
) -> None:
    label_restricted(controlplane, namespace)

    output = controlplane.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", str(example), check=False
    )

    assert "created (server dry run)" in output, output
    assert "Warning" not in output, output
    assert "error" not in output.lower(), output
    for cronjob in yaml.safe_load_all(example.read_text()):
        assert cronjob["kind"] == "CronJob"
        annotations = cronjob["metadata"]["annotations"]
        assert annotations["cronlock.io/enabled"] == "true"
        template = cronjob["spec"]["jobTemplate"]["spec"]["template"]
        assert {c["image"] for c in template["spec"]["containers"]} == {"busybox:1.37"}
        dry_run_pod(controlplane, namespace, template)


def test_images_by_digest_run_and_their_digest_is_the_only_sidecar_the_policy_admits(
    controlplane: ControlPlane,
) -> None:
    """Security review N12: `image.digest`/`sidecarImage.digest` name the images as
    repository@digest, and the operator's policy admits exactly that sidecar."""
    digest = "sha256:" + "ab" * 32
    docs = render(
        controlplane, "--set", f"image.digest={digest}", "--set", f"sidecarImage.digest={digest}"
    )
    [deployment] = [doc for doc in docs if doc["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"ghcr.io/cronlock/cronlock@{digest}"
    sidecar = f"ghcr.io/cronlock/cronlock-sidecar@{digest}"
    assert images_from(deployment)[0] == sidecar
    [policy] = [
        doc
        for doc in docs
        if doc["kind"] == "ValidatingAdmissionPolicy"
        and doc["metadata"]["name"].endswith("-operator-scope")
    ]
    pinned = [v["expression"] for v in policy["spec"]["validations"] if "image" in v["expression"]]
    # By its digest, from any repository (tests/integration/test_kustomize.py tries it).
    assert any(f'.matches("^[^@]+@{digest}$")' in expression for expression in pinned)
    assert not any("cronlock-sidecar:0.1.0" in expression for expression in pinned)
    assert (
        "does not match"
        in helm(
            controlplane,
            "template",
            "cronlock",
            str(CHART),
            "--set",
            "image.digest=latest",
            check=False,
        ).stderr
    )


def test_the_network_policy_lets_only_the_named_peers_scrape(
    controlplane: ControlPlane, namespace: str
) -> None:
    """Security review N5: with networkPolicy.enabled, /metrics is open only to the release's
    namespace and metricsFrom; the API server accepts the object (enforcing it is the CNI's)."""
    assert not [doc for doc in render(controlplane) if doc["kind"] == "NetworkPolicy"]
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}
    docs = render(
        controlplane,
        "--namespace",
        namespace,
        "--set",
        "networkPolicy.enabled=true",
        "--set-json",
        f"networkPolicy.metricsFrom=[{json.dumps(monitoring)}]",
    )
    [policy] = [doc for doc in docs if doc["kind"] == "NetworkPolicy"]
    metrics, healthz = policy["spec"]["ingress"]
    assert metrics == {
        "ports": [{"port": "metrics", "protocol": "TCP"}],
        "from": [{"podSelector": {}}, monitoring],
    }
    assert healthz == {"ports": [{"port": "healthz", "protocol": "TCP"}]}
    controlplane.kubectl("create", "--dry-run=server", "-f", "-", input_text=json.dumps(policy))
