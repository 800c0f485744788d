"""Inject the lease sidecar into a CronJob's job template, and take it out again exactly."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final, TypeGuard

from cronlock_operator.config import (
    PROBE_PERIOD_SECONDS,
    PROBE_TIMEOUT_SECONDS,
    InvalidConfig,
    LockConfig,
    OperatorSettings,
    is_cronlock_probe,
    pod_spec_of,
)
from cronlock_sidecar import contract
from cronlock_sidecar.durations import format_duration

SIDECAR_COMMAND: Final = ("cronlock-sidecar", "hold")
GATE_COMMAND: Final = ("cronlock-sidecar", "gate")
# Kubernetes refuses a podFailurePolicy with more rules than this; ours takes one.
MAX_POD_FAILURE_POLICY_RULES: Final = 20
# The injected containers' UID when nothing asks for another (distroless "nonroot").
SIDECAR_UID: Final = 65532
# Values of ANNOTATION_ORIGINAL_SHARE_PROCESS_NAMESPACE.
SHARE_PROCESS_NAMESPACE_FALSE: Final = "false"
SHARE_PROCESS_NAMESPACE_UNSET: Final = "unset"
# Value of ANNOTATION_ORIGINAL_TERMINATION_GRACE_PERIOD_SECONDS when the user wrote none.
TERMINATION_GRACE_PERIOD_UNSET: Final = "unset"
_GRACE: Final = "terminationGracePeriodSeconds"
_WHOLE_SECONDS: Final = re.compile(r"[0-9]{1,10}")  # int() refuses 4,301 digits

_RESOURCES: Final[Mapping[str, Any]] = {
    "requests": {"cpu": "10m", "memory": "32Mi"},
    "limits": {"memory": "64Mi"},
}
_VOLUME: Final[Mapping[str, Any]] = {
    "name": contract.VOLUME_NAME,
    "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"},
}
_SKIP_RULE: Final[Mapping[str, Any]] = {
    "action": "FailJob",
    "onExitCodes": {
        "containerName": contract.GATE_CONTAINER,
        "operator": "In",
        "values": [contract.EXIT_SKIPPED],
    },
}


def desired_cronjob(
    cronjob: Mapping[str, Any], config: LockConfig | None, settings: OperatorSettings
) -> dict[str, Any]:
    """The CronJob as it should be: injected with `config`, or as the user wrote it if None.

    Computed from the CronJob alone, injected or not, so a replayed event, an operator
    restart or a change of settings all converge on the same object.
    """
    if config is None:
        return revert(cronjob)
    return build_injection(cronjob, config, settings)


def build_injection(
    cronjob: Mapping[str, Any], config: LockConfig, settings: OperatorSettings
) -> dict[str, Any]:
    """A new CronJob whose job template takes the lock; the argument is left untouched.

    Any earlier injection is reverted first, so injecting twice equals injecting once.
    Raises InvalidConfig, before building anything, when the job template cannot be injected.
    """
    result = revert(cronjob)
    check_injectable(result, config)

    namespace = (result.get("metadata") or {}).get("namespace")
    if not namespace:
        raise ValueError("the CronJob has no metadata.namespace; the Lease needs one")
    # Filled only with what the user wrote and injection changed; merged in at the end.
    originals: dict[str, str] = {}
    job_template: dict[str, Any] = result["spec"]["jobTemplate"]
    job_spec: dict[str, Any] = job_template["spec"]
    pod_template: dict[str, Any] = job_spec["template"]
    pod_spec: dict[str, Any] = pod_template["spec"]

    if pod_spec["restartPolicy"] != "Never":
        originals[contract.ANNOTATION_ORIGINAL_RESTART_POLICY] = pod_spec["restartPolicy"]
        pod_spec["restartPolicy"] = "Never"

    # When a liveness failure leaves no container to restart, the kubelet kills the whole pod
    # with the pod's grace, not the probe's (kubernetes/kubernetes#119377); a user's own
    # probe under `stop: signal` does the same. Only a whole number can be compared: any
    # other value is the API server's to refuse, and is left alone.
    grace = pod_spec.get(_GRACE)
    if _GRACE not in pod_spec:
        originals[contract.ANNOTATION_ORIGINAL_TERMINATION_GRACE_PERIOD_SECONDS] = (
            TERMINATION_GRACE_PERIOD_UNSET
        )
        pod_spec[_GRACE] = config.kill_grace_seconds
    elif _is_whole_number(grace) and grace > config.kill_grace_seconds:
        originals[contract.ANNOTATION_ORIGINAL_TERMINATION_GRACE_PERIOD_SECONDS] = str(grace)
        pod_spec[_GRACE] = config.kill_grace_seconds

    sidecar_uid = SIDECAR_UID
    if config.stop == "signal":
        if pod_spec.get("shareProcessNamespace") is not True:
            originals[contract.ANNOTATION_ORIGINAL_SHARE_PROCESS_NAMESPACE] = (
                SHARE_PROCESS_NAMESPACE_FALSE
                if "shareProcessNamespace" in pod_spec
                else SHARE_PROCESS_NAMESPACE_UNSET
            )
            pod_spec["shareProcessNamespace"] = True
        # Restricted pods cannot have CAP_KILL: the sidecar signals as the user's UID.
        sidecar_uid = _user_uid(pod_spec) or SIDECAR_UID

    for container in _user_containers(pod_spec):
        mounts: list[dict[str, Any]] = container.setdefault("volumeMounts", [])
        mounts.append(
            {"name": contract.VOLUME_NAME, "mountPath": contract.RUN_DIR, "readOnly": True}
        )
    if config.stop == "liveness":
        for container in pod_spec["containers"]:
            container["livenessProbe"] = _held_probe(config)

    pod_spec["initContainers"] = [
        _sidecar_container(namespace, config, settings, sidecar_uid),
        _gate_container(config, settings),
        *pod_spec.get("initContainers", []),
    ]
    pod_spec.setdefault("volumes", []).append(copy.deepcopy(dict(_VOLUME)))

    policy: dict[str, Any] = job_spec.setdefault("podFailurePolicy", {})
    policy["rules"] = [copy.deepcopy(dict(_SKIP_RULE)), *policy.get("rules", [])]

    for template in (job_template, pod_template):
        labels: dict[str, str] = template.setdefault("metadata", {}).setdefault("labels", {})
        labels[contract.LABEL_LOCK] = config.lock
    if originals:
        result["metadata"].setdefault("annotations", {}).update(originals)
    return result


def revert(cronjob: Mapping[str, Any]) -> dict[str, Any]:
    """A new CronJob as the user wrote it: every piece cronlock added is taken out.

    Only a CronJob that carries cronlock's containers or its podFailurePolicy rule (which
    outlives the rest when someone else removed the containers) is changed: on any other,
    `cronlock.io/original-*` annotations are text a user wrote, not a record of injection,
    and must not rewrite the pod spec. Raises InvalidConfig when such a record holds a value
    cronlock never writes.
    """
    result: dict[str, Any] = copy.deepcopy(dict(cronjob))
    metadata: dict[str, Any] = result.get("metadata") or {}
    annotations: dict[str, str] = metadata.get("annotations") or {}
    job_template: dict[str, Any] = (result.get("spec") or {}).get("jobTemplate") or {}
    job_spec: dict[str, Any] = job_template.get("spec") or {}
    pod_template: dict[str, Any] = job_spec.get("template") or {}
    pod_spec: dict[str, Any] = pod_template.get("spec") or {}
    policy: dict[str, Any] | None = job_spec.get("podFailurePolicy")
    has_skip_rule = policy is not None and any(
        _is_skip_rule(rule) for rule in policy.get("rules") or []
    )
    injected = is_injected(cronjob)
    if not injected and not has_skip_rule:
        return result

    if injected:
        pod_spec["initContainers"] = [
            container
            for container in pod_spec.get("initContainers", [])
            if not _is_injected_container(container)
        ]
        _drop_if_empty(pod_spec, "initContainers")
        for container in _user_containers(pod_spec):
            container["volumeMounts"] = [
                mount
                for mount in container.get("volumeMounts", [])
                if mount.get("name") != contract.VOLUME_NAME
            ]
            _drop_if_empty(container, "volumeMounts")
            if is_cronlock_probe(container.get("livenessProbe")):
                del container["livenessProbe"]
        pod_spec["volumes"] = [
            volume
            for volume in pod_spec.get("volumes", [])
            if volume.get("name") != contract.VOLUME_NAME
        ]
        _drop_if_empty(pod_spec, "volumes")
        for template in (job_template, pod_template):
            labels = (template.get("metadata") or {}).get("labels") or {}
            labels.pop(contract.LABEL_LOCK, None)
            _drop_if_empty(template.get("metadata") or {}, "labels")
            _drop_if_empty(template, "metadata")

    # Our rule is recognisable by itself, even where the rest of the injection is gone.
    if policy is not None and has_skip_rule:
        policy["rules"] = [rule for rule in policy["rules"] if not _is_skip_rule(rule)]
        if not policy["rules"] and set(policy) == {"rules"}:
            del job_spec["podFailurePolicy"]

    restart_policy = annotations.pop(contract.ANNOTATION_ORIGINAL_RESTART_POLICY, None)
    if restart_policy is not None and pod_spec:
        pod_spec["restartPolicy"] = restart_policy
    share = annotations.pop(contract.ANNOTATION_ORIGINAL_SHARE_PROCESS_NAMESPACE, None)
    if share == SHARE_PROCESS_NAMESPACE_FALSE and pod_spec:
        pod_spec["shareProcessNamespace"] = False
    elif share is not None:
        pod_spec.pop("shareProcessNamespace", None)
    grace = annotations.pop(contract.ANNOTATION_ORIGINAL_TERMINATION_GRACE_PERIOD_SECONDS, None)
    if grace == TERMINATION_GRACE_PERIOD_UNSET:
        pod_spec.pop(_GRACE, None)
    elif grace is not None:
        if not _WHOLE_SECONDS.fullmatch(grace):
            raise InvalidConfig(
                contract.ANNOTATION_ORIGINAL_TERMINATION_GRACE_PERIOD_SECONDS,
                grace,
                "is not a value cronlock writes (a whole number of seconds, or "
                f'"{TERMINATION_GRACE_PERIOD_UNSET}"), so the pod\'s terminationGracePeriodSeconds '
                "cannot be restored; remove the annotation and set terminationGracePeriodSeconds "
                "in the job template yourself",
            )
        if pod_spec:
            pod_spec[_GRACE] = int(grace)
    if restart_policy is not None or share is not None or grace is not None:
        _drop_if_empty(metadata, "annotations")
    return result


def is_injected(cronjob: Mapping[str, Any]) -> bool:
    """Whether the job template carries cronlock's containers."""
    init_containers: list[Mapping[str, Any]] = pod_spec_of(cronjob).get("initContainers") or []
    return any(_is_injected_container(container) for container in init_containers)


def check_injectable(cronjob: Mapping[str, Any], config: LockConfig) -> None:
    """Raise InvalidConfig when the CronJob as the user wrote it cannot take the injection."""
    spec = pod_spec_of(cronjob)
    enabled = contract.ANNOTATION_ENABLED

    def refuse(reason: str) -> InvalidConfig:
        return InvalidConfig(enabled, "true", f"cannot be applied: {reason}")

    if not spec.get("containers"):
        raise refuse("the CronJob has no spec.jobTemplate.spec.template.spec.containers")
    restart_policy = spec.get("restartPolicy")
    if restart_policy not in ("Never", "OnFailure"):
        raise refuse(
            f"the job's restartPolicy is {restart_policy or 'unset'}; a Job's pods need "
            "OnFailure or Never"
        )
    for container in _user_containers(spec):
        name = container.get("name")
        if name in contract.INJECTED_CONTAINERS:
            raise refuse(
                f"the container name {name} is reserved for cronlock; rename the container"
            )
        for mount in container.get("volumeMounts") or []:
            if str(mount.get("mountPath", "")).rstrip("/") == contract.RUN_DIR:
                raise refuse(
                    f"container {name} mounts a volume at {contract.RUN_DIR}, cronlock's directory"
                )
        for port in container.get("ports") or []:
            if port.get("containerPort") == contract.SIDECAR_PORT:
                raise refuse(
                    f"container {name} uses port {contract.SIDECAR_PORT}, which the cronlock "
                    "sidecar listens on in the same pod"
                )
        if is_cronlock_probe(container.get("livenessProbe")):
            raise refuse(
                f"container {name} has a livenessProbe on port {contract.SIDECAR_PORT} "
                f"{contract.HELD_PATH}, the cronlock sidecar's"
            )
    for volume in spec.get("volumes") or []:
        if volume.get("name") == contract.VOLUME_NAME:
            raise refuse(
                f"the volume name {contract.VOLUME_NAME} is reserved for cronlock; "
                "rename the volume"
            )
    job_template: Mapping[str, Any] = cronjob["spec"]["jobTemplate"]
    job_spec: Mapping[str, Any] = job_template.get("spec") or {}
    rules = (job_spec.get("podFailurePolicy") or {}).get("rules") or []
    if len(rules) >= MAX_POD_FAILURE_POLICY_RULES:
        raise refuse(
            f"the job's podFailurePolicy has {len(rules)} rules; Kubernetes allows "
            f"{MAX_POD_FAILURE_POLICY_RULES} and cronlock needs one"
        )
    for where, template in (
        ("job template", job_template),
        ("pod template", job_spec.get("template") or {}),
    ):
        if contract.LABEL_LOCK in ((template.get("metadata") or {}).get("labels") or {}):
            raise refuse(
                f"the {where} already has the label {contract.LABEL_LOCK}, which cronlock sets"
            )
    if config.stop == "signal":
        _check_signal_uids(spec)


def needs_patch(actual: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether the stored CronJob differs from the desired one in what cronlock writes.

    Defaults the API server fills into cronlock's own pieces (terminationMessagePath,
    probe successThreshold, ...) are not differences; anything else is.
    """
    actual_job_template = _without_server_defaults(_job_template(actual), _job_template(desired))
    same_job_template: bool = _normalized(actual_job_template) == _normalized(
        _job_template(desired)
    )
    same_annotations: bool = _annotations(actual) == _annotations(desired)
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
            "value": copy.deepcopy(_job_template(desired)),
        }
    )
    before = _annotations(actual)
    after = _annotations(desired)
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


def _sidecar_container(
    namespace: str, config: LockConfig, settings: OperatorSettings, uid: int
) -> dict[str, Any]:
    return {
        "name": contract.SIDECAR_CONTAINER,
        "image": settings.sidecar_image,
        "imagePullPolicy": settings.sidecar_image_pull_policy,
        "command": list(SIDECAR_COMMAND),
        "restartPolicy": "Always",
        "ports": [{"name": "cronlock", "containerPort": contract.SIDECAR_PORT, "protocol": "TCP"}],
        "env": [
            _env(contract.ENV_LEASE, f"{namespace}/{config.lease_name}"),
            _env(contract.ENV_TTL, format_duration(config.ttl_seconds)),
            _env(contract.ENV_RENEW, format_duration(config.renew_seconds)),
            _env(contract.ENV_POLICY, config.policy),
            _env(contract.ENV_WAIT_TIMEOUT, format_duration(config.wait_timeout_seconds)),
            _env(contract.ENV_STOP, config.stop),
            _env(contract.ENV_KILL_GRACE, format_duration(config.kill_grace_seconds)),
            _env(contract.ENV_SKEW, format_duration(config.skew_seconds)),
            _env(contract.ENV_PORT, str(contract.SIDECAR_PORT)),
            _env(contract.ENV_RUN_DIR, contract.RUN_DIR),
            _field_env(contract.ENV_POD_NAME, "metadata.name"),
            _field_env(contract.ENV_POD_UID, "metadata.uid"),
            _field_env(contract.ENV_POD_NAMESPACE, "metadata.namespace"),
            _field_env(contract.ENV_JOB_NAME, f"metadata.labels['{contract.JOB_NAME_LABEL}']"),
        ],
        "resources": copy.deepcopy(dict(_RESOURCES)),
        "securityContext": _security_context(uid),
        "volumeMounts": [{"name": contract.VOLUME_NAME, "mountPath": contract.RUN_DIR}],
    }


def _gate_container(config: LockConfig, settings: OperatorSettings) -> dict[str, Any]:
    return {
        "name": contract.GATE_CONTAINER,
        "image": settings.sidecar_image,
        "imagePullPolicy": settings.sidecar_image_pull_policy,
        "command": list(GATE_COMMAND),
        "env": [
            _env(contract.ENV_RUN_DIR, contract.RUN_DIR),
            _env(contract.ENV_WAIT_TIMEOUT, format_duration(config.wait_timeout_seconds)),
        ],
        "resources": copy.deepcopy(dict(_RESOURCES)),
        "securityContext": _security_context(SIDECAR_UID),
        "volumeMounts": [{"name": contract.VOLUME_NAME, "mountPath": contract.RUN_DIR}],
    }


def _held_probe(config: LockConfig) -> dict[str, Any]:
    return {
        "httpGet": {"path": contract.HELD_PATH, "port": contract.SIDECAR_PORT},
        "periodSeconds": PROBE_PERIOD_SECONDS,
        "failureThreshold": 1,
        "timeoutSeconds": PROBE_TIMEOUT_SECONDS,
        "terminationGracePeriodSeconds": config.kill_grace_seconds,
    }


def _security_context(uid: int) -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": SIDECAR_UID,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def _field_env(name: str, field_path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": field_path}}}


def _user_uid(pod_spec: Mapping[str, Any]) -> int | None:
    """The UID the user's containers run as, when the pod spec says: pod level, else first."""
    pod_uid = (pod_spec.get("securityContext") or {}).get("runAsUser")
    if pod_uid is not None:
        return int(pod_uid)
    for container in pod_spec.get("containers") or []:
        uid = (container.get("securityContext") or {}).get("runAsUser")
        if uid is not None:
            return int(uid)
    return None


def _check_signal_uids(pod_spec: Mapping[str, Any]) -> None:
    """`stop: signal` can only reach processes of its own UID, and never root's."""
    pod_uid = (pod_spec.get("securityContext") or {}).get("runAsUser")
    uids = {
        str(container.get("name")): (container.get("securityContext") or {}).get(
            "runAsUser", pod_uid
        )
        for container in pod_spec.get("containers") or []
    }
    known = {uid for uid in uids.values() if uid is not None}
    if len(known) > 1:
        raise InvalidConfig(
            contract.ANNOTATION_STOP,
            "signal",
            "cannot stop containers that run as different users ("
            + ", ".join(f"{name}: {uid}" for name, uid in sorted(uids.items()))
            + "); run them as one non-root runAsUser",
        )
    if 0 in known:
        raise InvalidConfig(
            contract.ANNOTATION_STOP,
            "signal",
            "cannot stop containers that run as root (runAsUser: 0): the sidecar runs as non-root "
            "without CAP_KILL; run the job as a non-root runAsUser",
        )


def _user_containers(pod_spec: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The user's init containers and containers (cronlock's own are skipped)."""
    for container in pod_spec.get("initContainers") or []:
        if not _is_injected_container(container):
            yield container
    yield from pod_spec.get("containers") or []


def _is_injected_container(container: Mapping[str, Any]) -> bool:
    command = container.get("command") or []
    return container.get("name") in contract.INJECTED_CONTAINERS and tuple(command) in (
        SIDECAR_COMMAND,
        GATE_COMMAND,
    )


def _is_skip_rule(rule: Mapping[str, Any]) -> bool:
    exit_codes: Mapping[str, Any] = rule.get("onExitCodes") or {}
    return (
        rule.get("action") == "FailJob"
        and exit_codes.get("containerName") == contract.GATE_CONTAINER
        and exit_codes.get("operator") == "In"
        and exit_codes.get("values") == [contract.EXIT_SKIPPED]
    )


def _is_whole_number(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _drop_if_empty(node: dict[str, Any], key: str) -> None:
    if key in node and not node[key]:
        del node[key]


def _job_template(cronjob: Mapping[str, Any]) -> Mapping[str, Any]:
    job_template: Mapping[str, Any] = (cronjob.get("spec") or {}).get("jobTemplate") or {}
    return job_template


def _annotations(cronjob: Mapping[str, Any]) -> Mapping[str, str]:
    annotations: Mapping[str, str] = (cronjob.get("metadata") or {}).get("annotations") or {}
    return annotations


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
            if _is_injected_container(container):
                actual_pod[key][index] = _project(container, wanted)
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
        if volume.get("name") == contract.VOLUME_NAME and contract.VOLUME_NAME in wanted_volumes:
            actual_pod["volumes"][index] = _project(volume, wanted_volumes[contract.VOLUME_NAME])
    actual_rules = ((result.get("spec") or {}).get("podFailurePolicy") or {}).get("rules") or []
    for index, rule in enumerate(actual_rules):
        if _is_skip_rule(rule):
            actual_rules[index] = _project(rule, _SKIP_RULE)
    return result


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
