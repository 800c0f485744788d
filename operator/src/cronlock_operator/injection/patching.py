"""From a desired CronJob to the patch that makes it so, and whether one is needed at all.

The API server fills defaults into what cronlock writes (terminationMessagePath, probe
successThreshold, ...): those are not differences, or every reconcile would patch again.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from cronlock_operator.cronjob.podspec import is_cronlock_probe
from cronlock_operator.injection.containers import (
    OWN_VOLUMES,
    SKIP_RULE,
    USER_MOUNTS,
    is_injected_container,
    is_skip_rule,
)
from cronlock_operator.objects import annotation_path, annotations_of, still_at
from cronlock_operator.settings import parse_quantity


def needs_patch(actual: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether the stored CronJob differs from the desired one in what cronlock writes.

    Defaults the API server fills into cronlock's own pieces (terminationMessagePath,
    probe successThreshold, ...) are not differences; anything else is.
    """
    return job_template_differs(actual, desired) or annotations_differ(actual, desired)


def job_template_differs(actual: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    return bool(job_template_changes(actual, desired, limit=1))


def annotations_differ(actual: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    return annotations_of(actual) != annotations_of(desired)


def job_template_changes(
    actual: Mapping[str, Any], desired: Mapping[str, Any], limit: int = 8
) -> list[str]:
    """Where the stored job template differs from the desired one (server defaults in
    cronlock's pieces aside), as paths like
    `spec.template.spec.initContainers[cronlock].resources.limits.cpu`; at most `limit`."""
    wanted = job_template_of(desired)
    stored = _without_server_defaults(job_template_of(actual), wanted)
    found: list[str] = []
    _differences(_normalized(stored), _normalized(wanted), "", found, limit)
    return found


def job_template_fingerprint(cronjob: Mapping[str, Any]) -> str:
    """A digest of the job template as compared (nulls and empty values aside)."""
    text = json.dumps(_normalized(job_template_of(cronjob)), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _differences(actual: Any, desired: Any, path: str, found: list[str], limit: int) -> None:
    if len(found) >= limit or actual == desired:
        return
    if isinstance(actual, Mapping) and isinstance(desired, Mapping):
        for key in sorted(actual.keys() | desired.keys()):
            _differences(actual.get(key), desired.get(key), _join(path, key), found, limit)
        return
    if _named_list(actual) and _named_list(desired):
        by_name = {item["name"]: item for item in actual}
        wanted = {item["name"]: item for item in desired}
        if list(by_name) != list(wanted) and by_name.keys() == wanted.keys():
            found.append(f"{path} (order)")
        for name in [*wanted, *(n for n in by_name if n not in wanted)]:
            _differences(by_name.get(name), wanted.get(name), f"{path}[{name}]", found, limit)
        return
    found.append(path or "(all)")


def _named_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(item, Mapping) and isinstance(item.get("name"), str) for item in value
    )


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def injection_patch(actual: Mapping[str, Any], desired: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch (RFC 6902) that turns `actual` into `desired`, only if still unchanged.

    It tests metadata.resourceVersion, replaces spec.jobTemplate whole and sets or removes
    the annotations that differ; a concurrent writer makes it fail (422) instead of mixing.
    """
    operations: list[dict[str, Any]] = []
    version = (actual.get("metadata") or {}).get("resourceVersion")
    if version is not None:
        operations.append(still_at(version))
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
        path = annotation_path(key)
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
                name = mount.get("name")
                if name in USER_MOUNTS and name in wanted_mounts:
                    container["volumeMounts"][mount_index] = _project(mount, wanted_mounts[name])
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
