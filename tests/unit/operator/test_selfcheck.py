"""`cronlock-operator --check-metrics` (the chart's helm test): which endpoints it scrapes,
what counts as cronlock's metrics, how it retries and what it says when nothing serves."""

from __future__ import annotations

import http.server
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import prometheus_client
import pytest

from cronlock_operator import cli, selfcheck
from cronlock_operator.runtime import metrics
from cronlock_operator.selfcheck import Answer, Endpoint
from cronlock_sidecar import contract


def piece(*endpoints: dict[str, Any], port: int | None = 8080, name: str = "metrics") -> dict:
    """An EndpointSlice as the API server serves it (camelCase)."""
    return {
        "addressType": "IPv4",
        "endpoints": list(endpoints),
        "ports": [{"name": name, "port": port, "protocol": "TCP"}],
    }


def endpoint(*addresses: str, ready: bool | None = True) -> dict[str, Any]:
    conditions = {} if ready is None else {"ready": ready}
    return {"addresses": list(addresses), "conditions": conditions}


def test_ready_endpoints_take_the_metrics_port_and_leave_not_ready_ones() -> None:
    slices = [
        piece(endpoint("203.0.113.7"), endpoint("203.0.113.8", ready=False)),
        # An unknown readiness counts as ready, as for every EndpointSlice consumer.
        piece(endpoint("203.0.113.9", ready=None), port=9090),
        piece(endpoint("203.0.113.10"), name="healthz"),
        piece(endpoint("203.0.113.11"), port=None),
    ]
    assert selfcheck.ready_endpoints(slices) == [
        Endpoint("203.0.113.7", 8080),
        Endpoint("203.0.113.9", 9090),
    ]


def test_an_ipv6_endpoint_is_bracketed_in_its_url() -> None:
    assert Endpoint("2001:db8::7", 8080).url == "http://[2001:db8::7]:8080/metrics"
    assert Endpoint("203.0.113.7", 8080).url == "http://203.0.113.7:8080/metrics"


LEADING = Answer(leads=True)
WAITING = Answer()


def test_the_operators_own_metrics_pass_and_say_whether_it_leads() -> None:
    metrics.leader.set(0)
    try:
        text = prometheus_client.generate_latest(metrics.registry).decode()
        assert selfcheck.verdict(text) == WAITING
        metrics.leader.set(1)
        text = prometheus_client.generate_latest(metrics.registry).decode()
        assert selfcheck.verdict(text) == LEADING
    finally:
        metrics.leader.set(0)
    assert str(LEADING) == "cronlock's metrics, leading"
    assert str(WAITING) == "cronlock's metrics, waiting to lead"


def test_other_metrics_say_what_is_missing() -> None:
    other = prometheus_client.CollectorRegistry()
    prometheus_client.Counter("http_requests", "Not ours", registry=other)
    answer = selfcheck.verdict(prometheus_client.generate_latest(other).decode())
    assert answer == Answer(
        "no cronlock_build_info, cronlock_guarded_cronjobs, cronlock_leader in it"
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_it_retries_until_an_endpoint_serves_and_names_each_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    answers = iter([Answer("connection refused"), LEADING])
    slices = [piece(endpoint("203.0.113.7"))]
    with caplog.at_level(logging.INFO):
        code = selfcheck.check(
            lambda: slices, "ns/svc", 60, lambda e: next(answers), clock, clock.sleep
        )
    assert code == contract.EXIT_OK
    assert clock.sleeps == [selfcheck.RETRY_SECONDS]
    assert "http://203.0.113.7:8080/metrics: cronlock's metrics, leading" in caplog.text


def test_a_leader_and_a_serving_follower_pass_at_once() -> None:
    clock = Clock()
    slices = [piece(endpoint("203.0.113.7"), endpoint("203.0.113.8"))]

    def probe(e: Endpoint) -> Answer:
        return LEADING if e.address == "203.0.113.8" else WAITING

    assert selfcheck.check(lambda: slices, "ns/svc", 60, probe, clock, clock.sleep) == 0
    assert clock.sleeps == []


def test_a_follower_that_serves_nothing_fails_even_beside_a_leader(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Prometheus would count it as a down target: kube-prometheus' TargetDown fires.
    clock = Clock()
    slices = [piece(endpoint("203.0.113.7"), endpoint("203.0.113.8"))]

    def probe(e: Endpoint) -> Answer:
        return LEADING if e.address == "203.0.113.8" else Answer("connection refused")

    code = selfcheck.check(lambda: slices, "ns/svc", 10, probe, clock, clock.sleep)
    assert code == contract.EXIT_UNAVAILABLE
    assert "http://203.0.113.7:8080/metrics: connection refused" in caplog.text
    assert "not every endpoint of Service ns/svc served cronlock's metrics" in caplog.text


def test_replicas_that_all_wait_to_lead_fail(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    slices = [piece(endpoint("203.0.113.7"), endpoint("203.0.113.8"))]
    code = selfcheck.check(lambda: slices, "ns/svc", 10, lambda e: WAITING, clock, clock.sleep)
    assert code == contract.EXIT_UNAVAILABLE
    assert "no replica behind Service ns/svc led within 10s" in caplog.text


def test_it_fails_after_the_wait_with_each_endpoints_last_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    slices = [piece(endpoint("203.0.113.7"))]
    code = selfcheck.check(
        lambda: slices, "ns/svc", 10, lambda e: Answer("HTTP 500"), clock, clock.sleep
    )
    assert code == contract.EXIT_UNAVAILABLE
    assert 10 <= clock.now < 10 + selfcheck.RETRY_SECONDS + 1
    assert "http://203.0.113.7:8080/metrics: HTTP 500" in caplog.text
    assert "not every endpoint of Service ns/svc served cronlock's metrics within 10s" in (
        caplog.text
    )


def test_a_service_without_ready_endpoints_says_so(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    code = selfcheck.check(lambda: [], "ns/svc", 4, lambda e: LEADING, clock, clock.sleep)
    assert code == contract.EXIT_UNAVAILABLE
    assert "Service ns/svc has no ready endpoint on a port named 'metrics'" in caplog.text


@pytest.fixture
def server() -> Iterator[tuple[int, dict[str, Any]]]:
    """A loopback HTTP server answering /metrics with `state['status']` and `state['body']`."""
    state: dict[str, Any] = {"status": 200, "body": b""}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(state["status"])
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(state["body"])

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1], state
    httpd.shutdown()
    httpd.server_close()


def test_scrape_reads_a_real_http_answer(server: tuple[int, dict[str, Any]]) -> None:
    port, state = server
    state["body"] = prometheus_client.generate_latest(metrics.registry)
    assert selfcheck.scrape(Endpoint("127.0.0.1", port)).problem is None
    state["status"] = 500
    assert selfcheck.scrape(Endpoint("127.0.0.1", port)) == Answer("HTTP 500")


def test_scrape_of_a_closed_port_says_why() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert "refused" in (selfcheck.scrape(Endpoint("127.0.0.1", port)).problem or "").lower()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--check-metrics", "svc"], "--check-metrics: 'svc' is not NAMESPACE/NAME"),
        (["--check-metrics", "ns/svc", "--check-wait", "soon"], "--check-wait:"),
    ],
)
def test_a_bad_check_argument_exits_78_before_any_request(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == contract.EXIT_CONFIG
    assert message in capsys.readouterr().err
