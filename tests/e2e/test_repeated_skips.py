"""A lock that stays held turns skips into a RepeatedSkips Warning after alert-after runs, and
the operator's cronlock_consecutive_skips, read from its real /metrics after each real skip,
fires the chart's CronlockRepeatedSkips on Prometheus' own engine."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.e2e.scenario import UNTIL_FINISHED, Scenario
from tests.support.contract import EXIT_SKIPPED
from tests.support.controlplane import ControlPlane
from tests.support.helm import CHART, helm
from tests.support.kube import wait_for
from tests.support.ports import free_port
from tests.support.prometheus import (
    alert_expr,
    engine_agrees,
    rule_file,
    samples,
    selector,
)

METRICS_PORT = free_port()
NODE_OPERATOR_ARGS = ("--metrics-port", str(METRICS_PORT))


def consecutive_skips_series(cluster: Scenario, cronjob: str) -> tuple[dict[str, str], float]:
    """The operator's cronlock_consecutive_skips series for the CronJob, as scraped."""
    with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5) as page:
        text = page.read().decode()
    [found] = [
        (labels, value)
        for labels, value in samples(text, "cronlock_consecutive_skips")
        if labels.get("namespace") == cluster.namespace and labels.get("cronjob") == cronjob
    ]
    return found


def scraped_when(cluster: Scenario, cronjob: str, value: float) -> dict[str, str]:
    def seen() -> dict[str, str] | None:
        labels, now = consecutive_skips_series(cluster, cronjob)
        return labels if now == value else None

    return wait_for(seen, 30, f"cronlock_consecutive_skips {value:g} on /metrics")


@pytest.mark.timeout(300)
def test_repeated_skips_raise_a_warning_and_the_alert_after_alert_after(
    cluster: Scenario, controlplane: ControlPlane, tmp_path: Path
) -> None:
    cluster.cronjob("digest", f"echo digesting; {UNTIL_FINISHED}", alert_after="2")
    cluster.run("digest", "digest-1")
    holder = cluster.main_running("digest-1")  # holds until both contenders were counted

    cluster.run("digest", "digest-2")
    assert cluster.gate_exit("digest-2") == EXIT_SKIPPED
    cluster.wait_event("digest", "Skipped")
    wait_for(lambda: cluster.consecutive_skips("digest") == 1, 30, "consecutive-skips 1")
    assert cluster.events("digest", "RepeatedSkips") == []
    labels = scraped_when(cluster, "digest", 1)

    cluster.run("digest", "digest-3")
    assert cluster.gate_exit("digest-3") == EXIT_SKIPPED
    (kind, message), *_ = cluster.wait_event("digest", "RepeatedSkips")
    assert kind == "Warning"
    assert message.startswith("2 runs in a row skipped because lock digest is held")
    assert f"kubectl get lease -n {cluster.namespace} cronlock-digest" in message
    wait_for(lambda: cluster.consecutive_skips("digest") == 2, 30, "consecutive-skips 2")
    assert scraped_when(cluster, "digest", 2) == labels
    assert holder.running, "the holder kept working"

    cluster.finish(holder)
    assert cluster.main_finished("digest-1") == 0
    wait_for(lambda: cluster.consecutive_skips("digest") == 0, 30, "the success counted")
    assert scraped_when(cluster, "digest", 0) == labels

    # The chart's alert, with its threshold at this CronJob's alert-after, on the values the
    # operator really served after each skip and after the success, one scrape a minute.
    rendered = helm(
        controlplane,
        *("template", "cronlock", str(CHART), "--skip-tests"),
        *("--set", "prometheusRule.enabled=true,prometheusRule.repeatedSkips=2"),
        *("--api-versions", "monitoring.coreos.com/v1"),
    ).stdout
    docs = [doc for doc in yaml.safe_load_all(rendered) if doc]
    expr = alert_expr(rule_file(tmp_path, docs), "CronlockRepeatedSkips")
    fired = selector({"namespace": labels["namespace"], "cronjob": labels["cronjob"]})
    script = f"""
load 1m
  cronlock_consecutive_skips{selector(labels)} 1 2 0

eval instant at 0m {expr}

eval instant at 1m {expr}
  {fired} 2

eval instant at 2m {expr}
"""
    # The engine can disagree: the alert does not fire on the first skip.
    engine_agrees(tmp_path, script, ("eval instant at 1m", "eval instant at 0m"))
