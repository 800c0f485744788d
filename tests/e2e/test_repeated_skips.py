"""A lock that stays held turns skips into a RepeatedSkips Warning after alert-after runs."""

from __future__ import annotations

from tests.e2e.scenario import Scenario
from tests.support.contract import EXIT_SKIPPED
from tests.support.kube import wait_for


def test_repeated_skips_raise_a_warning_after_alert_after(cluster: Scenario) -> None:
    cluster.cronjob("digest", "echo digesting; sleep 40", alert_after="2")
    cluster.run("digest", "digest-1")
    cluster.main_running("digest-1")

    cluster.run("digest", "digest-2")
    assert cluster.gate_exit("digest-2") == EXIT_SKIPPED
    cluster.wait_event("digest", "Skipped")
    wait_for(lambda: cluster.consecutive_skips("digest") == 1, 30, "consecutive-skips 1")
    assert cluster.events("digest", "RepeatedSkips") == []

    cluster.run("digest", "digest-3")
    assert cluster.gate_exit("digest-3") == EXIT_SKIPPED
    (kind, message), *_ = cluster.wait_event("digest", "RepeatedSkips")
    assert kind == "Warning"
    assert message.startswith("2 runs in a row skipped because lock digest is held")
    assert f"kubectl get lease -n {cluster.namespace} cronlock-digest" in message
    wait_for(lambda: cluster.consecutive_skips("digest") == 2, 30, "consecutive-skips 2")
    assert cluster.works("digest-1")[0].running, "the holder kept working"
