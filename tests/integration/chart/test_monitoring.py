"""The chart's monitoring: the PrometheusRule parsed and run on Prometheus' engine, the
Grafana dashboard, the PodMonitor and ServiceMonitor, the documented KubeJobFailed rule."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.integration.chart.harness import CHART, helm, kinds, render
from tests.support.controlplane import ControlPlane
from tests.support.paths import ROOT
from tests.support.prometheus import alert_expr, engine_agrees, promql_eval, rule_file
from tests.support.tools import gotool


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
    assert "1 groups, 8 rules" in checked.stdout
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
        "CronlockMaxHoldExceeded",
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
        "CronlockMaxHoldExceeded": "warning",
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
    # The engine can disagree: a wrong expectation fails.
    engine_agrees(tmp_path, script, ("eval instant at 3m", "eval instant at 8m"))


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
    engine_agrees(tmp_path, script, ("eval instant at 9m", "eval instant at 12m"))


def test_every_alert_about_a_namespace_keeps_it_on_prometheus_engine(
    controlplane: ControlPlane, tmp_path: Path
) -> None:
    """Alertmanager routes by the namespace (and the lock): two teams' series fire apart."""
    on = ["--set", "prometheusRule.enabled=true", "--api-versions", "monitoring.coreos.com/v1"]
    rules = rule_file(tmp_path, render(controlplane, *on))
    cleared = alert_expr(rules, "CronlockExpiredHoldCleared")
    unguarded = alert_expr(rules, "CronlockCronJobsNotGuarded")
    errors = alert_expr(rules, "CronlockReconcileErrors")
    held = alert_expr(rules, "CronlockMaxHoldExceeded")
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
  cronlock_max_hold_exceeded_total{{{job},namespace="team-a",cronjob="ledger"}} 0x30
  cronlock_max_hold_exceeded_total{{{job},namespace="team-b",cronjob="report"}} 0x10 1x20

# A hold cleared in team-a at minute 11: its lock alone.
eval instant at 12m {cleared}
  {{namespace="team-a", lock="ledger"}} 1

# Two CronJobs of team-b in conflict from minute 6; team-a's and the guarded ones quiet.
eval instant at 8m {unguarded}
  {{namespace="team-b", state="conflict"}} 2

# team-a fails a reconcile a minute: 15 in the window, over the threshold (5).
eval instant at 20m {errors}
  {{namespace="team-a"}} 15

# A run of team-b's report stopped at its max-hold at minute 11: that CronJob alone.
eval instant at 12m {held}
  {{namespace="team-b", cronjob="report"}} 1
"""
    engine_agrees(tmp_path, script, ('namespace="team-a", lock', "lock"))


def test_the_pod_monitor_scrapes_the_port_the_injection_gives_every_sidecar(
    controlplane: ControlPlane,
) -> None:
    from cronlock_operator.cronjob.config import parse_config
    from cronlock_operator.injection.build import desired_cronjob
    from cronlock_sidecar import contract
    from tests.support import gen
    from tests.support.cronjobs import SETTINGS

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
    cronjob = gen.cronjob("report")
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
    assert len(alerts) == 6
    for name, alert in alerts.items():
        assert alert["labels"]["team"] == "platform", name
        assert alert["labels"]["cluster"] == "prod-eu", name
        assert alert["labels"]["severity"], name
    checked = rulecheck(rule_file(tmp_path, docs))
    assert checked.returncode == 0, checked.stderr
    assert "1 groups, 6 rules" in checked.stdout
    # A label the alerts set themselves, or an alert that does not exist, is refused.
    for bad in ("prometheusRule.alertLabels.namespace=x", "prometheusRule.disabled.Nope=true"):
        refused = helm(
            controlplane, "template", "cronlock", str(CHART), *on, "--set", bad, check=False
        )
        assert refused.returncode != 0, bad
        assert "values don't meet the specifications of the schema" in refused.stderr, bad


KUBE_JOB_FAILED = ROOT / "manifests" / "prometheus" / "kube-job-failed.yaml"


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
