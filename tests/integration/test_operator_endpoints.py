"""What the operator exposes to a cluster's tooling: metrics, liveness and JSON logs."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from tests.support import gen
from tests.support.controlplane import ControlPlane
from tests.support.cronjobs import job_from_cronjob
from tests.support.flood import CONNECTIONS, HEADER_LINES, HeaderFlood, peak_rss, rss_mib
from tests.support.kube import finish_pod, wait_for
from tests.support.objects import read
from tests.support.operator import OperatorProcess, get
from tests.support.paths import ROOT
from tests.support.ports import free_port
from tests.support.prometheus import samples


@pytest.fixture
def observed_operator(
    controlplane: ControlPlane, operator_kubeconfig: Path, tmp_path: Path
) -> Iterator[tuple[OperatorProcess, int, int]]:
    metrics_port, liveness_port = free_port(), free_port()
    process = OperatorProcess(
        operator_kubeconfig,
        tmp_path / "operator.log",
        controlplane.env,
        args=[
            "--metrics-port",
            str(metrics_port),
            "--liveness",
            f"http://127.0.0.1:{liveness_port}/healthz",
            "--log-format",
            "json",
        ],
    )
    process.start()
    yield process, metrics_port, liveness_port
    process.stop()


def test_metrics_liveness_and_json_logs(
    api: kubernetes.client.ApiClient,
    namespace: str,
    observed_operator: tuple[OperatorProcess, int, int],
) -> None:
    process, metrics_port, liveness_port = observed_operator
    kubernetes.client.BatchV1Api(api).create_namespaced_cron_job(
        namespace,
        gen.cronjob("watched", *gen.BY_HAND),
    )

    held = f'cronlock_lease_held{{lock="watched",namespace="{namespace}"}} 0.0'

    def scraped() -> str | None:
        _, text = get(f"http://127.0.0.1:{metrics_port}/metrics")
        guarded = [
            line for line in text.splitlines() if line.startswith("cronlock_guarded_cronjobs ")
        ]
        # The reconcile's duration is observed as it returns, after it set the gauges.
        timed = [
            line
            for line in text.splitlines()
            if line.startswith('cronlock_reconcile_duration_seconds_count{kind="cronjob"}')
        ]
        done = bool(timed) and float(timed[0].split()[1]) >= 1
        return text if held in text and float(guarded[0].split()[1]) >= 1 and done else None

    text = wait_for(scraped, timeout=30, what="the CronJob and its Lease in the metrics")
    for family in (
        "cronlock_runs_total counter",
        "cronlock_consecutive_skips gauge",
        "cronlock_lease_held gauge",
        "cronlock_takeovers_total counter",
        "cronlock_overlaps_total counter",
        "cronlock_replacements_total counter",
        "cronlock_reconcile_errors_total counter",
    ):
        assert f"# TYPE {family}" in text, family
    # Counters exist at 0 before anything happened, and no *_created series.
    for result in ("acquired", "skipped", "lost", "released"):
        assert f'cronlock_runs_total{{result="{result}"}} ' in text, result
    # By namespace (and lock), so each team's alerts reach it: from the first sight at 0.
    assert (
        f'cronlock_takeovers_total{{lock="watched",namespace="{namespace}",reason="expired"}} 0.0'
    ) in text
    assert f'cronlock_cronjobs{{namespace="{namespace}",state="guarded"}} 1.0' in text
    assert f'cronlock_cronjobs{{namespace="{namespace}",state="conflict"}} 0.0' in text
    assert "cronlock_overlaps_total 0.0" in text
    assert "cronlock_replacements_total 0.0" in text
    assert f'cronlock_reconcile_errors_total{{kind="cronjob",namespace="{namespace}"}} ' in text
    assert "_created" not in text
    assert 'cronlock_build_info{python="' in text
    assert 'version="0.1.0"} 1.0' in text
    # How long reconciles take, per kind; the CronJob's took at least one.
    assert "# TYPE cronlock_reconcile_duration_seconds histogram" in text
    count = [
        line
        for line in text.splitlines()
        if line.startswith('cronlock_reconcile_duration_seconds_count{kind="cronjob"}')
    ]
    assert float(count[0].split()[1]) >= 1
    status, body = get(f"http://127.0.0.1:{liveness_port}/healthz")
    assert status == 200
    assert json.loads(body)["state"] == "running"

    def injected_logged() -> bool:
        # The last line may still be being written: only complete lines are read.
        complete = process.log().rpartition("\n")[0]
        lines = [line for line in complete.splitlines() if line.strip()]
        records = [json.loads(line) for line in lines]  # every line is JSON
        return any("Injected" in str(record.get("message")) for record in records)

    assert wait_for(injected_logged, timeout=30, what="the Injected line in the JSON log")
    # One schema with the sidecar's JSON lines (tests/unit/sidecar/test_run.py): kopf's
    # own lines too, and those about an object name it.
    complete = process.log().rpartition("\n")[0]
    records = [json.loads(line) for line in complete.splitlines() if line.strip()]
    for record in records:
        assert set(record) >= {"timestamp", "level", "logger", "message"}, record
        assert "severity" not in record
    assert any(record["logger"].startswith("kopf") for record in records)

    # A deleted CronJob's Lease goes (garbage collector), and with it its series: none
    # stays behind showing the last value for ever.
    kubernetes.client.BatchV1Api(api).delete_namespaced_cron_job(
        "watched", namespace, propagation_policy="Foreground"
    )

    def series_gone() -> bool:
        _, text = get(f"http://127.0.0.1:{metrics_port}/metrics")
        return f'lock="watched",namespace="{namespace}"' not in text

    wait_for(series_gone, timeout=60, what="the deleted lock's series to be removed")


def test_tick_outcomes_are_counted_by_outcome_on_metrics(
    api: kubernetes.client.ApiClient,
    namespace: str,
    observed_operator: tuple[OperatorProcess, int, int],
) -> None:
    """Issue 56, every tick accounted for: a run skipped as already ran and one skipped
    for a held lock are one tick each under their own outcome, a manual run is no tick,
    and every outcome is on the page from 0, as Prometheus' parser reads it."""
    process, metrics_port, _ = observed_operator
    manifest = gen.cronjob("counted", *gen.BY_HAND, gen.with_job(backoffLimit=0))
    # The Jobs are the CronJob's (owned by it): with the default failedJobsHistoryLimit (1)
    # its controller deleted two of them, and their pods, before the operator had counted
    # them, so the "already ran" one was counted as a skip from its last state (a fresh run
    # of e87f6b8; the Events showed the controller's SuccessfulDelete).
    manifest["spec"]["failedJobsHistoryLimit"] = 10
    batch = kubernetes.client.BatchV1Api(api)
    batch.create_namespaced_cron_job(namespace, manifest)
    body = wait_for(
        lambda: (
            c
            if "cronlock-gate" in str((c := read(api, namespace, "counted"))["spec"]["jobTemplate"])
            else None
        ),
        timeout=30,
        what="the injection",
    )
    core = kubernetes.client.CoreV1Api(api)

    def finished(job: str, message: str) -> None:
        batch.create_namespaced_job(namespace, job_from_cronjob(body, job))
        pod = wait_for(
            lambda: core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items,
            timeout=30,
            what=f"a pod for {job}",
        )[0]
        finish_pod(core, namespace, pod.metadata.name, gate_exit=75, gate_message=message)

    def ticks() -> dict[str, float]:
        _, text = get(f"http://127.0.0.1:{metrics_port}/metrics")
        return {
            labels["outcome"]: value
            for labels, value in samples(text, "cronlock_ticks_total")
            if labels["namespace"] == namespace and labels["cronjob"] == "counted"
        }

    # From the first sight of the CronJob's schedule, every outcome at 0.
    wait_for(lambda: len(ticks()) == 5, 30, "the tick series at 0")
    assert ticks() == dict.fromkeys(("worked", "overlap", "already_ran", "frozen", "missed"), 0)

    finished("counted-29416320", "already ran: tick 2026-12-06T12:00:00Z of counted ...")
    finished("counted-29416321", "lease is held")
    finished("counted-manual-1", "lease is held")  # `kubectl create job --from`: no tick

    # The Job controller fails each Job (its pod's gate exit 75), then the operator counts
    # it; a failure says where each Job stood.
    try:
        wait_for(
            lambda: ticks()["already_ran"] == 1 and ticks()["overlap"] == 1,
            60,
            "both ticks counted",
        )
        # The manual run's skip is counted as a run (cronlock_runs_total), not as a tick.
        wait_for(lambda: _skipped_runs(metrics_port) == 2, 60, "the manual run's skip counted")
    except AssertionError as error:
        raise AssertionError(
            f"{error}; {_where_jobs_stand(api, namespace)}; ticks {ticks()}; "
            f"operator log: {process.log()[-3000:]}"
        ) from None
    assert ticks() == {"worked": 0, "overlap": 1, "already_ran": 1, "frozen": 0, "missed": 0}


def _where_jobs_stand(api: kubernetes.client.ApiClient, namespace: str) -> str:
    """Each Job's conditions and its pods' phases, and the namespace's Events, in a line."""
    batch = kubernetes.client.BatchV1Api(api)
    core = kubernetes.client.CoreV1Api(api)
    jobs = [
        f"{job.metadata.name}: "
        + ",".join(f"{c.type}={c.status}" for c in (job.status.conditions or []))
        for job in batch.list_namespaced_job(namespace).items
    ]
    pods = [
        f"{p.metadata.name}: {p.status.phase}" for p in core.list_namespaced_pod(namespace).items
    ]
    events = [f"{e.reason}: {e.message}" for e in core.list_namespaced_event(namespace).items]
    return f"jobs {jobs}; pods {pods}; events {events}"


def _skipped_runs(port: int) -> float:
    _, text = get(f"http://127.0.0.1:{port}/metrics")
    return sum(
        value
        for labels, value in samples(text, "cronlock_runs_total")
        if labels["result"] == "skipped"
    )


def test_metrics_listen_only_where_they_are_told(
    controlplane: ControlPlane, operator_kubeconfig: Path, tmp_path: Path
) -> None:
    port = free_port()
    process = OperatorProcess(
        operator_kubeconfig,
        tmp_path / "operator.log",
        controlplane.env,
        args=["--metrics-port", str(port), "--metrics-bind-address", "127.0.0.2"],
    )
    process.start()
    try:
        status, text = wait_for(
            lambda: get(f"http://127.0.0.2:{port}/metrics"), 30, "the metrics on 127.0.0.2"
        )
        assert status == 200
        assert "cronlock_guarded_cronjobs" in text
        with pytest.raises(OSError, match="refused"):
            get(f"http://127.0.0.1:{port}/metrics")
    finally:
        process.stop()


def test_a_bind_address_that_is_not_an_ip_exits_78_naming_the_flag(
    controlplane: ControlPlane, operator_kubeconfig: Path, tmp_path: Path
) -> None:
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "cronlock-operator"),
            "--metrics-bind-address",
            "all-of-them",
        ],
        env=dict(controlplane.env, KUBECONFIG=str(operator_kubeconfig)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 78
    assert "--metrics-bind-address: 'all-of-them' is not an IP address" in result.stderr


FLOOD_SECONDS = 15.0
RSS_GROWTH_MIB = 40  # of the 256 MiB the chart gives the operator


def test_a_header_flood_on_both_ports_leaves_the_operator_small_and_answering(
    observed_operator: tuple[OperatorProcess, int, int],
) -> None:
    """Security review M3 and L10, on the real operator: 200 connections to each port,
    each sending 120 header lines of 8 KB that never end, reopened when closed."""
    process, metrics_port, liveness_port = observed_operator
    assert process.process is not None
    pid = process.process.pid
    wait_for(lambda: get(f"http://127.0.0.1:{liveness_port}/healthz")[0] == 200, 30, "alive")
    before = rss_mib(pid)
    floods = [
        HeaderFlood(liveness_port, "/healthz", FLOOD_SECONDS, network="127.0.3"),
        HeaderFlood(metrics_port, "/metrics", FLOOD_SECONDS, network="127.0.4"),
    ]
    threads = [threading.Thread(target=flood.run, daemon=True) for flood in floods]
    answers: list[tuple[str, int | str, float]] = []
    with peak_rss(pid) as rss:
        for thread in threads:
            thread.start()
        # The kubelet and Prometheus, each from its own address, all through the flood.
        while any(thread.is_alive() for thread in threads):
            for port, path in ((liveness_port, "/healthz"), (metrics_port, "/metrics")):
                began = time.monotonic()
                status: int | str
                try:
                    status = _get_from("127.0.0.2", port, path)
                except (OSError, http.client.HTTPException) as error:
                    status = repr(error)  # the evidence of a failed probe or scrape
                answers.append((path, status, time.monotonic() - began))
            time.sleep(0.5)
        for thread in threads:
            thread.join()
    after = rss_mib(pid)

    slowest = max(seconds for _, _, seconds in answers)
    print(  # the figures for docs/SECURITY.md (pytest -s)
        f"operator flood: {CONNECTIONS} x {HEADER_LINES} x 8 KB headers per port; "
        + "; ".join(
            f"{flood.path}: {flood.opened} opened, {flood.sent / 2**20:.0f} MiB sent"
            for flood in floods
        )
        + f"; operator RSS {before:.1f} -> peak {rss.peak:.1f} -> {after:.1f} MiB; "
        f"{len(answers)} probes and scrapes, slowest {slowest:.2f}s"
    )
    assert all(flood.sent > 100 * 2**20 for flood in floods), "a flood never got through"
    assert rss.peak - before < RSS_GROWTH_MIB
    assert len(answers) >= 20
    # What the kubelet needs (the chart's livenessProbe: an answer within timeoutSeconds,
    # a restart only after failureThreshold misses in a row), and Prometheus alike: no
    # run of that many misses on either port, and nine in ten answered. One probe in 50
    # waited out the liveness port's 2 s line in a full run on this 2-core machine with
    # five other rings beside it (docs/DEVELOPMENT.md).
    probe = chart_liveness_probe()
    for path in ("/healthz", "/metrics"):
        statuses = [status for where, status, _ in answers if where == path]
        longest = max_run(status != 200 for status in statuses)
        assert longest < probe["failureThreshold"], (path, answers)
        assert sum(status == 200 for status in statuses) >= 0.9 * len(statuses), answers
    assert slowest <= probe["timeoutSeconds"] + 0.5


def chart_liveness_probe() -> dict[str, Any]:
    """The operator container's livenessProbe as the chart renders it (install.yaml)."""
    for document in yaml.safe_load_all((ROOT / "manifests" / "install.yaml").read_text()):
        if document and document.get("kind") == "Deployment":
            for container in document["spec"]["template"]["spec"]["containers"]:
                if "livenessProbe" in container:
                    probe: dict[str, Any] = container["livenessProbe"]
                    return probe
    raise AssertionError("manifests/install.yaml has no Deployment with a livenessProbe")


def max_run(misses: Iterable[bool]) -> int:
    """The longest run of True in `misses`."""
    longest = current = 0
    for missed in misses:
        current = current + 1 if missed else 0
        longest = max(longest, current)
    return longest


def _get_from(source: str, port: int, path: str) -> int:
    """The status of one GET of 127.0.0.1:`port``path`, sent from `source`, waited for as
    long as the kubelet waits for the operator's probe."""
    connection = http.client.HTTPConnection(
        "127.0.0.1",
        port,
        timeout=chart_liveness_probe()["timeoutSeconds"],
        source_address=(source, 0),
    )
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        answer.read()
        return answer.status
    finally:
        connection.close()
