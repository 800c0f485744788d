"""Inject the lease sidecar into a CronJob's job template, and take it out again exactly."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final, TypeGuard

from cronlock_operator.cronjob.config import InvalidConfig, LockConfig
from cronlock_operator.cronjob.podspec import is_cronlock_probe, pod_spec_of
from cronlock_operator.injection.containers import (
    OWN_VOLUMES,
    SKIP_RULE,
    SUCCESS_VOLUME,
    USER_MOUNTS,
    VOLUME,
    gate_container,
    held_probe,
    is_injected_container,
    is_skip_rule,
    sidecar_container,
    store_volume,
)
from cronlock_operator.settings import OperatorSettings
from cronlock_sidecar import contract

# Kubernetes refuses a podFailurePolicy with more rules than this; ours takes one.
MAX_POD_FAILURE_POLICY_RULES: Final = 20
# Values of ANNOTATION_ORIGINAL_SHARE_PROCESS_NAMESPACE.
SHARE_PROCESS_NAMESPACE_FALSE: Final = "false"
SHARE_PROCESS_NAMESPACE_UNSET: Final = "unset"
# Value of ANNOTATION_ORIGINAL_TERMINATION_GRACE_PERIOD_SECONDS when the user wrote none.
TERMINATION_GRACE_PERIOD_UNSET: Final = "unset"
_GRACE: Final = "terminationGracePeriodSeconds"
_WHOLE_SECONDS: Final = re.compile(r"[0-9]{1,10}")  # int() refuses 4,301 digits


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

    sidecar_uid = settings.sidecar_run_as_user
    if config.stop == "signal":
        if pod_spec.get("shareProcessNamespace") is not True:
            originals[contract.ANNOTATION_ORIGINAL_SHARE_PROCESS_NAMESPACE] = (
                SHARE_PROCESS_NAMESPACE_FALSE
                if "shareProcessNamespace" in pod_spec
                else SHARE_PROCESS_NAMESPACE_UNSET
            )
            pod_spec["shareProcessNamespace"] = True
        # Restricted pods cannot have CAP_KILL: the sidecar signals as the user's UID.
        sidecar_uid = _user_uid(pod_spec) or settings.sidecar_run_as_user

    for container in _user_containers(pod_spec):
        mounts: list[dict[str, Any]] = container.setdefault("volumeMounts", [])
        mounts.append(
            {"name": contract.VOLUME_NAME, "mountPath": contract.RUN_DIR, "readOnly": True}
        )
        if config.shared_store:
            mounts.append({"name": contract.SUCCESS_VOLUME_NAME, "mountPath": contract.SUCCESS_DIR})
    if config.stop == "liveness":
        for container in pod_spec["containers"]:
            container["livenessProbe"] = held_probe(config)

    pod_spec["initContainers"] = [
        sidecar_container(
            namespace,
            config,
            settings,
            sidecar_uid,
            cronjob_name=str((result.get("metadata") or {}).get("name") or ""),
        ),
        gate_container(config, settings),
        *pod_spec.get("initContainers", []),
    ]
    pod_spec.setdefault("volumes", []).append(copy.deepcopy(dict(VOLUME)))
    if config.shared_store:
        pod_spec["volumes"].append(store_volume(config))
        pod_spec["volumes"].append(copy.deepcopy(dict(SUCCESS_VOLUME)))

    policy: dict[str, Any] = job_spec.setdefault("podFailurePolicy", {})
    policy["rules"] = [copy.deepcopy(dict(SKIP_RULE)), *policy.get("rules", [])]

    for template in (job_template, pod_template):
        labels: dict[str, str] = template.setdefault("metadata", {}).setdefault("labels", {})
        labels[contract.LABEL_LOCK] = config.lock
    if config.policy == "queue":
        # Each run's Job is created suspended, so no pod exists while it is queued; the
        # operator lets it go (`spec.suspend: false`) when the lock is free.
        job_spec["suspend"] = True
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
        is_skip_rule(rule) for rule in policy.get("rules") or []
    )
    injected = is_injected(cronjob)
    if not injected and not has_skip_rule:
        return result

    if injected:
        # `suspend` is ours exactly when the injected sidecar runs under queue: a user's own
        # suspend is refused with that policy (check_injectable) and kept with the others.
        if _injected_policy(pod_spec) == "queue":
            job_spec.pop("suspend", None)
        pod_spec["initContainers"] = [
            container
            for container in pod_spec.get("initContainers", [])
            if not is_injected_container(container)
        ]
        _drop_if_empty(pod_spec, "initContainers")
        for container in _user_containers(pod_spec):
            container["volumeMounts"] = [
                mount
                for mount in container.get("volumeMounts", [])
                if mount.get("name") not in USER_MOUNTS
            ]
            _drop_if_empty(container, "volumeMounts")
            if is_cronlock_probe(container.get("livenessProbe")):
                del container["livenessProbe"]
        pod_spec["volumes"] = [
            volume
            for volume in pod_spec.get("volumes", [])
            if volume.get("name") not in OWN_VOLUMES
        ]
        _drop_if_empty(pod_spec, "volumes")
        for template in (job_template, pod_template):
            labels = (template.get("metadata") or {}).get("labels") or {}
            labels.pop(contract.LABEL_LOCK, None)
            _drop_if_empty(template.get("metadata") or {}, "labels")
            _drop_if_empty(template, "metadata")

    # Our rule is recognisable by itself, even where the rest of the injection is gone.
    if policy is not None and has_skip_rule:
        policy["rules"] = [rule for rule in policy["rules"] if not is_skip_rule(rule)]
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


def _injected_policy(pod_spec: Mapping[str, Any]) -> str | None:
    """The policy the injected sidecar was given (its CRONLOCK_POLICY), if injected."""
    for container in pod_spec.get("initContainers") or []:
        if container.get("name") == contract.SIDECAR_CONTAINER and is_injected_container(container):
            for env in container.get("env") or []:
                if env.get("name") == contract.ENV_POLICY:
                    return str(env.get("value"))
    return None


def is_injected(cronjob: Mapping[str, Any]) -> bool:
    """Whether the job template carries cronlock's containers."""
    init_containers: list[Mapping[str, Any]] = pod_spec_of(cronjob).get("initContainers") or []
    return any(is_injected_container(container) for container in init_containers)


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
            path = str(mount.get("mountPath", "")).rstrip("/")
            if path == contract.RUN_DIR or (config.shared_store and path == contract.SUCCESS_DIR):
                raise refuse(f"container {name} mounts a volume at {path}, cronlock's directory")
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
        if volume.get("name") in OWN_VOLUMES:
            raise refuse(
                f"the volume name {volume.get('name')} is reserved for cronlock; rename the volume"
            )
    if spec.get("automountServiceAccountToken") is False and not config.shared_store:
        raise refuse(
            "the pod sets automountServiceAccountToken: false, and the cronlock sidecar needs "
            "the pod's token to hold its Lease; remove the field or set it to true"
        )
    job_template: Mapping[str, Any] = cronjob["spec"]["jobTemplate"]
    job_spec: Mapping[str, Any] = job_template.get("spec") or {}
    # One lock, one run: two pods of one Job would take the Lease from each other.
    for field_name in ("parallelism", "completions"):
        value = job_spec.get(field_name)
        if _is_whole_number(value) and value > 1:
            raise refuse(
                f"the job's {field_name} is {value}; a lock guards one pod at a time, so a "
                f"guarded Job runs one pod ({field_name}: 1)"
            )
    if job_spec.get("completionMode") == "Indexed":
        raise refuse(
            "the job's completionMode is Indexed; a lock guards one pod at a time, so a "
            "guarded Job is NonIndexed"
        )
    if config.policy == "queue" and "suspend" in job_spec:
        raise InvalidConfig(
            contract.ANNOTATION_POLICY,
            "queue",
            f"cannot be applied: the job template sets suspend: "
            f"{json.dumps(job_spec['suspend'])}; under queue cronlock suspends each run's Job "
            "itself and lets it go when the lock is free (remove suspend from the job "
            "template, or suspend the CronJob itself with spec.suspend)",
        )
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


def _user_uid(pod_spec: Mapping[str, Any]) -> int | None:
    """The UID the user's containers run as, when the pod spec says: each container's own,
    else the pod's (the one the kernel sees; `_check_signal_uids` made them agree)."""
    pod_uid = (pod_spec.get("securityContext") or {}).get("runAsUser")
    for container in pod_spec.get("containers") or []:
        uid = (container.get("securityContext") or {}).get("runAsUser", pod_uid)
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
        if not is_injected_container(container):
            yield container
    yield from pod_spec.get("containers") or []


def _is_whole_number(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _drop_if_empty(node: dict[str, Any], key: str) -> None:
    if key in node and not node[key]:
        del node[key]
