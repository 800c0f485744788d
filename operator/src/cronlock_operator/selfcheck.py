"""`cronlock-operator --check-metrics NAMESPACE/SERVICE`: the chart's `helm test`.

It scrapes the operator the way Prometheus does through a ServiceMonitor: it reads the
metrics Service's EndpointSlices and asks each ready endpoint for /metrics directly, so
it needs neither cluster DNS nor kube-proxy, and it sees each replica on its own. It
passes when every ready endpoint serves cronlock's metrics (a replica waiting to lead
serves them too, so that Prometheus sees no target down) and one of them leads
(`cronlock_leader 1`), and retries until `wait` runs out: a new replica takes a moment to
lead.
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from cronlock_sidecar import contract

logger = logging.getLogger(__name__)
PORT_NAME = "metrics"
SCRAPE_TIMEOUT = 5.0
RETRY_SECONDS = 2.0
# What a cronlock operator's /metrics always carries (cronlock_operator.runtime.metrics).
REQUIRED = ("cronlock_build_info", "cronlock_guarded_cronjobs", "cronlock_leader")
LEADER = "cronlock_leader"


@dataclass(frozen=True)
class Answer:
    """What one endpoint answered: cronlock's metrics (`problem` None), leading or not."""

    problem: str | None = None
    leads: bool = False

    def __str__(self) -> str:
        if self.problem is not None:
            return self.problem
        return f"cronlock's metrics, {'leading' if self.leads else 'waiting to lead'}"


@dataclass(frozen=True)
class Endpoint:
    address: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"


def ready_endpoints(slices: Iterable[Mapping[str, Any]]) -> list[Endpoint]:
    """The ready addresses of EndpointSlices (as the API serves them), on the port named
    `metrics`; a slice without that port contributes nothing."""
    found: list[Endpoint] = []
    for piece in slices:
        ports = [p.get("port") for p in piece.get("ports") or () if p.get("name") == PORT_NAME]
        if not ports or ports[0] is None:
            continue
        for endpoint in piece.get("endpoints") or ():
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            found.extend(Endpoint(address, int(ports[0])) for address in endpoint["addresses"])
    return sorted(set(found), key=lambda e: (e.address, e.port))


def verdict(text: str) -> Answer:
    """Whether `text` is cronlock's metrics (else what is wrong with it) and says it leads."""
    try:
        families = {family.name: family for family in text_string_to_metric_families(text)}
    except ValueError as error:
        return Answer(f"not Prometheus text: {error}")
    missing = [name for name in REQUIRED if name not in families]
    if missing:
        return Answer(f"no {', '.join(missing)} in it")
    return Answer(leads=any(sample.value == 1 for sample in families[LEADER].samples))


def scrape(endpoint: Endpoint) -> Answer:
    """What the endpoint serves, or why it serves nothing (one line)."""
    try:
        with urllib.request.urlopen(endpoint.url, timeout=SCRAPE_TIMEOUT) as answer:  # noqa: S310
            return verdict(answer.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as error:
        return Answer(f"HTTP {error.code}")
    except (OSError, ValueError) as error:
        return Answer(str(getattr(error, "reason", error)))


def check(
    list_slices: Callable[[], list[Mapping[str, Any]]],
    service: str,
    wait: float,
    probe: Callable[[Endpoint], Answer] = scrape,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Exit code: 0 when, within `wait` seconds, every ready endpoint of `service` served
    cronlock's metrics and one of them led; EXIT_UNAVAILABLE otherwise (each endpoint's
    last answer is logged)."""
    deadline = clock() + wait
    while True:
        endpoints = ready_endpoints(list_slices())
        answers = {endpoint: probe(endpoint) for endpoint in endpoints}
        served = all(answer.problem is None for answer in answers.values())
        if answers and served and any(answer.leads for answer in answers.values()):
            for endpoint, answer in answers.items():
                logger.info("%s: %s", endpoint.url, answer)
            return contract.EXIT_OK
        if clock() >= deadline:
            break
        sleep(RETRY_SECONDS)
    if not answers:
        logger.error("Service %s has no ready endpoint on a port named %r", service, PORT_NAME)
    for endpoint, answer in answers.items():
        logger.error("%s: %s", endpoint.url, answer)
    if answers and served:
        logger.error("no replica behind Service %s led within %gs", service, wait)
    else:
        logger.error(
            "not every endpoint of Service %s served cronlock's metrics within %gs", service, wait
        )
    return contract.EXIT_UNAVAILABLE


def check_service(namespace: str, service: str, wait: float) -> int:
    """`check` against the API server (in a pod, with its ServiceAccount)."""
    import kubernetes

    from cronlock_operator.kube.answers import answered
    from cronlock_operator.kube.client import api_client
    from cronlock_operator.kube.errors import APIError

    api = api_client()
    discovery = kubernetes.client.DiscoveryV1Api(api)

    def list_slices() -> list[Mapping[str, Any]]:
        with answered(f"list the EndpointSlices of Service {namespace}/{service}"):
            answer = discovery.list_namespaced_endpoint_slice(
                namespace, label_selector=f"kubernetes.io/service-name={service}"
            )
        return [api.sanitize_for_serialization(item) for item in answer.items]

    try:
        return check(list_slices, f"{namespace}/{service}", wait)
    except APIError as error:
        logger.error("cannot %s", error)
    return contract.EXIT_UNAVAILABLE
