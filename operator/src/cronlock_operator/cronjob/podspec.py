"""Where a CronJob's pod template is, and which of its probes is cronlock's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cronlock_sidecar import contract


def is_cronlock_probe(probe: Mapping[str, Any] | None) -> bool:
    """Whether a livenessProbe is the one cronlock adds (GET /held on the sidecar's port)."""
    if not probe:
        return False
    http_get: Mapping[str, Any] = probe.get("httpGet") or {}
    return (
        http_get.get("path") == contract.HELD_PATH and http_get.get("port") == contract.SIDECAR_PORT
    )


def containers_with_own_liveness_probe(cronjob: Mapping[str, Any]) -> list[str]:
    """The user's containers that have a livenessProbe of their own (not cronlock's)."""
    spec = pod_spec_of(cronjob)
    containers: list[Mapping[str, Any]] = spec.get("containers") or []
    return [
        str(container.get("name"))
        for container in containers
        if container.get("livenessProbe") and not is_cronlock_probe(container["livenessProbe"])
    ]


# The account a pod runs as when its spec names none: every pod of the namespace that
# names none runs as it.
DEFAULT_SERVICE_ACCOUNT = "default"


def service_account_of(cronjob: Mapping[str, Any]) -> str:
    """The ServiceAccount the CronJob's runs' pods run as."""
    return str(pod_spec_of(cronjob).get("serviceAccountName") or DEFAULT_SERVICE_ACCOUNT)


def pod_spec_of(cronjob: Mapping[str, Any]) -> Mapping[str, Any]:
    """spec.jobTemplate.spec.template.spec, empty where the CronJob lacks it."""
    node: Mapping[str, Any] = cronjob
    for key in ("spec", "jobTemplate", "spec", "template", "spec"):
        node = node.get(key) or {}
    return node
