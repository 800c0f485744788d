"""Prometheus' own engine and parser for the chart's rules: a rule file as Prometheus loads
it, an alert's expression, a promqltest script run on the real query engine (built from
Prometheus' pinned Go module), and the series a real /metrics page exposes."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.tools import gotool


def rule_file(directory: Path, docs: list[dict[str, Any]]) -> Path:
    """The PrometheusRule's groups as the rule file Prometheus would load."""
    [rule] = [doc for doc in docs if doc["kind"] == "PrometheusRule"]
    path = directory / f"rules-{secrets.token_hex(3)}.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


def alert_expr(rule_path: Path, alert: str) -> str:
    groups = yaml.safe_load(rule_path.read_text())["groups"]
    [expr] = [r["expr"] for g in groups for r in g["rules"] if r.get("alert") == alert]
    return " ".join(str(expr).split())


def promql_eval(directory: Path, script: str) -> subprocess.CompletedProcess[str]:
    """`script` (Prometheus' promqltest format) run on Prometheus' own query engine."""
    path = directory / f"script-{secrets.token_hex(3)}.test"
    path.write_text(script)
    return subprocess.run(
        [gotool("promqleval"), "-test.run", "TestScripts", "--", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def engine_agrees(directory: Path, script: str, wrong: tuple[str, str]) -> None:
    """`script` passes on Prometheus' engine, and fails with `wrong[0]` (its first place)
    made `wrong[1]`: the engine can disagree, so its PASS means something."""
    ran = promql_eval(directory, script)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.startswith("PASS"), ran.stdout
    assert promql_eval(directory, script.replace(*wrong, 1)).returncode != 0, wrong


def samples(exposition: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of series `name` on a /metrics page, as Prometheus' text parser reads it."""
    return [
        (dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == name
    ]


def selector(labels: dict[str, str]) -> str:
    """`{a="x",b="y"}`, the labels as a promqltest series names them."""
    return "{" + ",".join(f'{key}="{value}"' for key, value in sorted(labels.items())) + "}"
