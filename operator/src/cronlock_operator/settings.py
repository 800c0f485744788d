"""The operator's process settings: what its flags (and so the chart) decide for every
CronJob. The images, UIDs and resources of what it injects are its own; the lock defaults
a CronJob's annotations are read under are a `cronjob.defaults.LockDefaults`, spelled and
checked there once.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

from cronlock_operator.cronjob.defaults import LockDefaults
from cronlock_operator.cronjob.policies import Policy

_IMAGE_PULL_POLICIES: Final = ("Always", "IfNotPresent", "Never")
# A tick record's field (lock/ticks.py): printable ASCII, no space.
_CLUSTER_NAME: Final = re.compile(r"[!-~]{1,253}$")
# The injected containers' UID and GID unless set otherwise (distroless "nonroot", the
# image's USER).
SIDECAR_UID: Final = 65532
# Kubernetes accepts a runAsUser/runAsGroup up to 2^31 - 1; 0 is root.
MAX_ID: Final = 2**31 - 1
# A Kubernetes quantity (k8s.io/apimachinery resource.Quantity): a number, then a binary
# or decimal SI suffix or a decimal exponent.
_QUANTITY = re.compile(
    r"\+?(?P<number>[0-9]+(\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE](?P<exponent>[+-]?[0-9]{1,3}))?"
)
_BINARY: Final = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL: Final = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(text: str) -> Decimal:
    """The value of a Kubernetes quantity (`10m`, `64Mi`, `0.5`, `1e3`); ValueError."""
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(
            f"{text!r} is not a Kubernetes quantity; expected for example 100m or 0.1 (CPU), "
            "64Mi or 128M (memory)"
        )
    number = Decimal(match["number"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * Decimal(1024) ** _BINARY[suffix]
    if match["exponent"] is not None:
        return number.scaleb(int(match["exponent"]))
    return number.scaleb(_DECIMAL.get(suffix, 0))


@dataclass(frozen=True)
class ContainerResources:
    """The injected containers' resources; None leaves a request or limit unset."""

    cpu_request: str | None = "10m"
    memory_request: str | None = "32Mi"
    cpu_limit: str | None = None
    memory_limit: str | None = "64Mi"

    def __post_init__(self) -> None:
        for resource in ("cpu", "memory"):
            request = getattr(self, f"{resource}_request")
            limit = getattr(self, f"{resource}_limit")
            values: dict[str, Decimal] = {}
            for kind, text in (("request", request), ("limit", limit)):
                if text is None:
                    continue
                try:
                    values[kind] = parse_quantity(text)
                except ValueError as error:
                    raise ValueError(f"sidecar {resource} {kind}: {error}") from None
                if values[kind] <= 0:
                    raise ValueError(
                        f"sidecar {resource} {kind}: {text!r} must be more than 0; "
                        "leave it unset instead"
                    )
            if len(values) == 2 and values["limit"] < values["request"]:
                raise ValueError(
                    f"sidecar {resource} limit {limit} is less than its request {request}; "
                    "Kubernetes refuses a request above the limit"
                )

    def as_spec(self) -> dict[str, dict[str, str]]:
        """A container's `resources`, without the empty parts."""
        spec: dict[str, dict[str, str]] = {}
        for kind in ("request", "limit"):
            values = {
                resource: text
                for resource in ("cpu", "memory")
                if (text := getattr(self, f"{resource}_{kind}")) is not None
            }
            if values:
                spec[f"{kind}s"] = values
        return spec


@dataclass(frozen=True)
class OperatorSettings:
    """What the operator's flags (and so the chart) decide for every CronJob: the images,
    UIDs and resources of what it injects, and the lock defaults (`lock`). It is itself a
    `Defaults`, read through `lock`; `lock.stores_allowed` follows `sidecar_stores_image`."""

    sidecar_image: str
    sidecar_image_pull_policy: str = "IfNotPresent"
    lock: LockDefaults = field(default_factory=LockDefaults)
    # None leaves runAsUser/runAsGroup unset: the platform (OpenShift's restricted-v2) or
    # the image's numeric USER decides. Under `stop: signal` the sidecar runs as the
    # user's UID instead, to signal its processes.
    sidecar_run_as_user: int | None = SIDECAR_UID
    sidecar_run_as_group: int | None = SIDECAR_UID
    sidecar_resources: ContainerResources = field(default_factory=ContainerResources)
    # The sidecar image with the Redis and PostgreSQL clients (the Dockerfile's
    # `sidecar-stores` target), injected instead of `sidecar_image` into CronJobs whose
    # lock is in such a store; None: such CronJobs are refused.
    sidecar_stores_image: str | None = None
    # This cluster's name, as the lock's tick records name it (lock/ticks.py; `cronlock
    # status` shows which cluster worked a tick); "" leaves it unnamed.
    cluster_name: str = ""

    def __post_init__(self) -> None:
        if not self.sidecar_image:
            raise ValueError("the sidecar image must not be empty")
        if self.sidecar_stores_image == "":
            raise ValueError("the sidecar stores image must not be empty; leave it unset")
        for name, value in (
            ("sidecar runAsUser", self.sidecar_run_as_user),
            ("sidecar runAsGroup", self.sidecar_run_as_group),
        ):
            if value is not None and not 1 <= value <= MAX_ID:
                raise ValueError(
                    f"{name} {value} is not a non-root id; expected 1 to {MAX_ID}, or unset "
                    "to let the platform assign one"
                )
        if self.sidecar_image_pull_policy not in _IMAGE_PULL_POLICIES:
            raise ValueError(
                f"sidecar image pull policy {self.sidecar_image_pull_policy!r} is not one of "
                + ", ".join(_IMAGE_PULL_POLICIES)
            )
        if self.cluster_name and not _CLUSTER_NAME.match(self.cluster_name):
            raise ValueError(
                f"cluster name {self.cluster_name!r} is not one; expected 1-253 printable "
                "characters without spaces (e.g. eu-west-1), or '' for none"
            )
        stores_allowed = self.sidecar_stores_image is not None
        if self.lock.stores_allowed != stores_allowed:
            # A store needs the stores image: whether one is given decides, not the caller.
            object.__setattr__(
                self, "lock", dataclasses.replace(self.lock, stores_allowed=stores_allowed)
            )

    # `Defaults`, read through `lock` (cronjob/defaults.py says what each means).
    @property
    def default_ttl_seconds(self) -> int:
        return self.lock.default_ttl_seconds

    @property
    def default_renew_seconds(self) -> float | None:
        return self.lock.default_renew_seconds

    @property
    def default_policy(self) -> Policy:
        return self.lock.default_policy

    @property
    def skew_seconds(self) -> int:
        return self.lock.skew_seconds

    @property
    def default_alert_after_missed(self) -> int:
        return self.lock.default_alert_after_missed

    @property
    def missed_tolerance_seconds(self) -> int:
        return self.lock.missed_tolerance_seconds

    @property
    def stores_allowed(self) -> bool:
        return self.lock.stores_allowed


# The operator Deployment's init containers that name the images to inject (the chart's
# deployment.yaml), read at start under --sidecar-images-from.
SIDECAR_IMAGE_CONTAINER = "sidecar-image"
SIDECAR_STORES_IMAGE_CONTAINER = "sidecar-stores-image"


def images_from(deployment: Mapping[str, Any]) -> tuple[str, str | None]:
    """The sidecar image and the stores image (None when absent) that a Deployment's init
    containers `sidecar-image` and `sidecar-stores-image` name; ValueError says what is
    missing. Kustomize's `images:` rewrites these as it rewrites any container's."""
    metadata = deployment.get("metadata") or {}
    where = f"{metadata.get('namespace', '?')}/{metadata.get('name', '?')}"
    pod = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    images = {
        container.get("name"): container.get("image")
        for container in pod.get("initContainers") or []
        if isinstance(container, Mapping)
    }
    sidecar = images.get(SIDECAR_IMAGE_CONTAINER)
    if not isinstance(sidecar, str) or not sidecar.strip():
        raise ValueError(
            f"deployment {where} has no init container {SIDECAR_IMAGE_CONTAINER!r} with an "
            "image: it names the sidecar image to inject (the chart renders it)"
        )
    if SIDECAR_STORES_IMAGE_CONTAINER not in images:
        return sidecar, None
    stores = images[SIDECAR_STORES_IMAGE_CONTAINER]
    if not isinstance(stores, str) or not stores.strip():
        raise ValueError(
            f"deployment {where}: init container {SIDECAR_STORES_IMAGE_CONTAINER!r} has no image"
        )
    return sidecar, stores
