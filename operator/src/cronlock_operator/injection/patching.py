"""From a desired CronJob to the patch that makes it so, and whether one is needed at all.

The API server fills defaults into what cronlock writes (terminationMessagePath, probe
successThreshold, ...): those are not differences, or every reconcile would patch again.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from cronlock_operator.injection.containers import (
    OWN_VOLUMES,
    SKIP_RULE,
    is_injected_container,
    is_skip_rule,
)
from cronlock_operator.lock.config import parse_quantity
from cronlock_operator.objects import annotations_of
from cronlock_operator.podspec import is_cronlock_probe
from cronlock_sidecar import contract


def needs_patch(actual: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether the stored CronJob differs from the desired one in what cronlock writes.

    Defaults the API server fills into cronlock's own pieces (terminationMessagePath,
    probe successThreshold, ...) are not differences; anything else is.
    """
    actual_job_template = _without_server_defaults(
        job_template_of(actual), job_template_of(desired)
    )
    same_job_template: bool = _normalized(actual_job_template) == _normalized(
        job_template_of(desired)
    )
    same_annotations: bool = annotations_of(actual) == annotations_of(desired)
    return not (same_job_template and same_annotations)


def injection_patch(actual: Mapping[str, Any], desired: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch (RFC 6902) that turns `actual` into `desired`, only if still unchanged.

    It tests metadata.resourceVersion, replaces spec.jobTemplate whole and sets or removes
    the annotations that differ; a concurrent writer makes it fail (422) instead of mixing.
    """
    operations: list[dict[str, Any]] = []
    version = (actual.get("metadata") or {}).get("resourceVersion")
    if version is not None:
        operations.append({"op": "test", "path": "/metadata/resourceVersion", "value": version})
    operations.append(
        {
            "op": "replace",
            "path": "/spec/jobTemplate",
            "value": copy.deepcopy(job_template_of(desired)),
        }
    )
    before = annotations_of(actual)
    after = annotations_of(desired)
    if not before and after:
        operations.append({"op": "add", "path": "/metadata/annotations", "value": dict(after)})
        return operations
    for key in sorted(before.keys() | after.keys()):
        path = "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")
        if key not in after:
            operations.append({"op": "remove", "path": path})
        elif before.get(key) != after[key]:
            operations.append({"op": "add", "path": path, "value": after[key]})
    return operations


def job_template_of(cronjob: Mapping[str, Any]) -> Mapping[str, Any]:
    job_template: Mapping[str, Any] = (cronjob.get("spec") or {}).get("jobTemplate") or {}
    return job_template


def _without_server_defaults(actual: Mapping[str, Any], desired: Mapping[str, Any]) -> Any:
    """`actual` with the keys inside cronlock's pieces that `desired` does not set removed."""
    result: dict[str, Any] = copy.deepcopy(dict(actual))
    actual_pod = (((result.get("spec") or {}).get("template") or {}).get("spec")) or {}
    desired_pod: Mapping[str, Any] = (
        ((desired.get("spec") or {}).get("template") or {}).get("spec")
    ) or {}

    desired_containers = {
        container.get("name"): container
        for container in [
            *desired_pod.get("initContainers", []),
            *desired_pod.get("containers", []),
        ]
    }
    for key in ("initContainers", "containers"):
        for index, container in enumerate(actual_pod.get(key) or []):
            wanted = desired_containers.get(container.get("name"))
            if wanted is None:
                continue
            if is_injected_container(container):
                actual_pod[key][index] = _injected_as_compared(container, wanted)
                continue
            if "livenessProbe" in container and is_cronlock_probe(wanted.get("livenessProbe")):
                container["livenessProbe"] = _project(
                    container["livenessProbe"], wanted["livenessProbe"]
                )
            wanted_mounts = {mount.get("name"): mount for mount in wanted.get("volumeMounts", [])}
            for mount_index, mount in enumerate(container.get("volumeMounts") or []):
                if (
                    mount.get("name") == contract.VOLUME_NAME
                    and contract.VOLUME_NAME in wanted_mounts
                ):
                    container["volumeMounts"][mount_index] = _project(
                        mount, wanted_mounts[contract.VOLUME_NAME]
                    )
    wanted_volumes = {volume.get("name"): volume for volume in desired_pod.get("volumes", [])}
    for index, volume in enumerate(actual_pod.get("volumes") or []):
        name = volume.get("name")
        if name in OWN_VOLUMES and name in wanted_volumes:
            actual_pod["volumes"][index] = _project(volume, wanted_volumes[name])
    actual_rules = ((result.get("spec") or {}).get("podFailurePolicy") or {}).get("rules") or []
    for index, rule in enumerate(actual_rules):
        if is_skip_rule(rule):
            actual_rules[index] = _project(rule, SKIP_RULE)
    return result


def _injected_as_compared(actual: Mapping[str, Any], desired: Mapping[str, Any]) -> Any:
    """An injected container cut down to what cronlock writes, but with its security context
    and resources whole: the API server defaults neither field beyond a request from its
    limit, so a UID or a limit that the settings no longer set is a difference."""
    result = _project(actual, desired)
    if "securityContext" in actual:
        result["securityContext"] = actual["securityContext"]
    resources: Mapping[str, Any] = actual.get("resources") or {}
    wanted: Mapping[str, Any] = desired.get("resources") or {}
    result["resources"] = wanted if _same_resources(resources, wanted) else resources
    return result


def _same_resources(actual: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether two `resources` ask for the same amounts, as the API server stores them: a
    quantity in its canonical form (0.5 is 500m), a missing request defaulted to the limit."""
    expected = {
        "limits": dict(desired.get("limits") or {}),
        "requests": {**(desired.get("limits") or {}), **(desired.get("requests") or {})},
    }
    if set(actual) - set(expected):
        return False
    for kind, wanted in expected.items():
        stored: Mapping[str, Any] = actual.get(kind) or {}
        if set(stored) != set(wanted):
            return False
        for resource, text in wanted.items():
            try:
                if parse_quantity(str(stored[resource])) != parse_quantity(str(text)):
                    return False
            except ValueError:
                return False
    return True


def _project(actual: Any, desired: Any) -> Any:
    """`actual` cut down to the keys `desired` has, recursively."""
    if isinstance(actual, Mapping) and isinstance(desired, Mapping):
        return {
            key: _project(value, desired[key]) for key, value in actual.items() if key in desired
        }
    if isinstance(actual, list) and isinstance(desired, list) and len(actual) == len(desired):
        return [_project(item, wanted) for item, wanted in zip(actual, desired, strict=True)]
    return actual


def _normalized(value: Any) -> Any:
    """`value` without nulls, empty maps and empty lists, which the API server omits."""
    if isinstance(value, Mapping):
        kept = {key: _normalized(item) for key, item in value.items()}
        return {key: item for key, item in kept.items() if item not in (None, {}, [])}
    if isinstance(value, list):
        return [_normalized(item) for item in value]
    return value
