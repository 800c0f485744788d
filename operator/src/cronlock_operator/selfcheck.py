"""`cronlock-operator --check-metrics NAMESPACE/SERVICE`: the chart's `helm test`.

It scrapes the operator the way Prometheus does through a ServiceMonitor: it reads the
metrics Service's EndpointSlices and asks each ready endpoint for /metrics directly, so
it needs neither cluster DNS nor kube-proxy, and it sees each replica on its own. It
passes when one endpoint serves cronlock's metrics (with leader election only the leader
serves them; the others wait for the lead), and retries until `wait` runs out: the
operator serves /metrics only once its start-up list is done.
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
REQUIRED = ("cronlock_build_info", "cronlock_guarded_cronjobs")


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


def verdict(text: str) -> str | None:
    """None when `text` is cronlock's metrics, else what is wrong with it."""
    try:
        names = {family.name for family in text_string_to_metric_families(text)}
    except ValueError as error:
        return f"not Prometheus text: {error}"
    missing = [name for name in REQUIRED if name not in names]
    return f"no {', '.join(missing)} in it" if missing else None


def scrape(endpoint: Endpoint) -> str | None:
    """None when the endpoint serves cronlock's metrics, else why not (one line)."""
    try:
        with urllib.request.urlopen(endpoint.url, timeout=SCRAPE_TIMEOUT) as answer:  # noqa: S310
            return verdict(answer.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as error:
        return f"HTTP {error.code}"
    except (OSError, ValueError) as error:
        return str(getattr(error, "reason", error))


def check(
    list_slices: Callable[[], list[Mapping[str, Any]]],
    service: str,
    wait: float,
    probe: Callable[[Endpoint], str | None] = scrape,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Exit code: 0 when an endpoint of `service` served cronlock's metrics within `wait`
    seconds, EXIT_UNAVAILABLE when none did (each endpoint's last answer is logged)."""
    deadline = clock() + wait
    while True:
        endpoints = ready_endpoints(list_slices())
        answers = {endpoint: probe(endpoint) for endpoint in endpoints}
        good = [endpoint for endpoint, problem in answers.items() if problem is None]
        if good:
            for endpoint, problem in answers.items():
                logger.info("%s: %s", endpoint.url, problem or "cronlock's metrics")
            return contract.EXIT_OK
        if clock() >= deadline:
            break
        sleep(RETRY_SECONDS)
    if not answers:
        logger.error("Service %s has no ready endpoint on a port named %r", service, PORT_NAME)
    for endpoint, problem in answers.items():
        logger.error("%s: %s", endpoint.url, problem)
    logger.error("no endpoint of Service %s served cronlock's metrics within %gs", service, wait)
    return contract.EXIT_UNAVAILABLE


def check_service(namespace: str, service: str, wait: float) -> int:
    """`check` against the API server (in a pod, with its ServiceAccount)."""
    import kubernetes
    import urllib3

    from cronlock_operator.kube.client import api_client

    api = api_client()
    discovery = kubernetes.client.DiscoveryV1Api(api)

    def list_slices() -> list[Mapping[str, Any]]:
        answer = discovery.list_namespaced_endpoint_slice(
            namespace, label_selector=f"kubernetes.io/service-name={service}"
        )
        return [api.sanitize_for_serialization(item) for item in answer.items]

    try:
        return check(list_slices, f"{namespace}/{service}", wait)
    except kubernetes.client.ApiException as error:
        problem = f"{error.status} {error.reason}"
    except urllib3.exceptions.HTTPError as error:
        problem = str(error)
    logger.error("cannot list the EndpointSlices of Service %s/%s: %s", namespace, service, problem)
    return contract.EXIT_UNAVAILABLE
