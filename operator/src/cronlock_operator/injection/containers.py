"""The pieces injection adds to a pod: the sidecar, the gate, the probe and the skip rule.

Every injected container runs under restricted pod security (non-root, no privilege
escalation, all capabilities dropped, read-only root, RuntimeDefault seccomp); its UID, GID
and resources are the operator's settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final, get_args

from cronlock_operator.cronjob.config import LockConfig
from cronlock_operator.cronjob.defaults import LockDefaults
from cronlock_operator.cronjob.podspec import pod_spec_of
from cronlock_operator.cronjob.policies import Policy
from cronlock_operator.cronjob.timing import PROBE_PERIOD_SECONDS
from cronlock_operator.settings import OperatorSettings
from cronlock_sidecar import contract
from cronlock_sidecar.lock.durations import format_duration, parse_duration
from cronlock_sidecar.lock.ticks import valid_name

SIDECAR_COMMAND: Final = ("cronlock-sidecar", "hold")
GATE_COMMAND: Final = ("cronlock-sidecar", "gate")
VOLUME: Final[Mapping[str, Any]] = {
    "name": contract.VOLUME_NAME,
    "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"},
}
# A lock in a store: where the work says its tick succeeded (contract.SUCCESS_DIR).
SUCCESS_VOLUME: Final[Mapping[str, Any]] = {
    "name": contract.SUCCESS_VOLUME_NAME,
    "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"},
}
# Every volume injection adds: the run dir, and for a lock in a store (Redis, PostgreSQL)
# its Secret and the success volume.
OWN_VOLUMES: Final = (
    contract.VOLUME_NAME,
    contract.STORE_VOLUME_NAME,
    contract.SUCCESS_VOLUME_NAME,
)
# The mounts injection adds to the user's containers: the run dir (read-only) and, for a
# lock in a store, the success volume (writable: the work creates its file there).
USER_MOUNTS: Final = (contract.VOLUME_NAME, contract.SUCCESS_VOLUME_NAME)
SKIP_RULE: Final[Mapping[str, Any]] = {
    "action": "FailJob",
    "onExitCodes": {
        "containerName": contract.GATE_CONTAINER,
        "operator": "In",
        "values": [contract.EXIT_SKIPPED],
    },
}


def sidecar_container(
    namespace: str,
    config: LockConfig,
    settings: OperatorSettings,
    uid: int | None,
    *,
    cronjob_name: str = "",
) -> dict[str, Any]:
    """The `cronlock` native sidecar; `uid` is the settings' or, under `stop: signal`, the
    user's (None: unset). A lock in Redis or PostgreSQL runs the stores image, which has
    their clients, and reads the store's URL from the Secret mounted into it alone.

    Each tick at most once (lock/ticks.py): the sidecar learns whose ticks its Job works
    (`cronjob_name`, literal: the Job's name says which tick), the Job's uid (its retry
    pods are the same run) and the cluster's name, for the record its claim writes."""
    tick_env = []
    if valid_name(cronjob_name):
        tick_env = [
            _env(contract.ENV_CRONJOB, cronjob_name),
            _field_env(contract.ENV_JOB_UID, f"metadata.labels['{contract.JOB_UID_LABEL}']"),
        ]
    if settings.cluster_name:
        tick_env.append(_env(contract.ENV_CLUSTER, settings.cluster_name))
    # Only when set: a CronJob without a bound keeps the injection it had before max-hold.
    bound_env = (
        [_env(contract.ENV_MAX_HOLD, format_duration(config.max_hold_seconds))]
        if config.max_hold_seconds > 0
        else []
    )
    jitter_env = _jitter_env(config)
    store_env, store_mounts = [], []
    image = settings.sidecar_image
    if config.shared_store:
        assert settings.sidecar_stores_image is not None  # parse_store refused it otherwise
        image = settings.sidecar_stores_image
        store_env = [
            _env(contract.ENV_STORE_FILE, contract.STORE_URL_FILE),
            _env(contract.ENV_STORE_KIND, config.store),
        ]
        if config.permits > 1:  # a store's document has no operator to write its N
            store_env.append(_env(contract.ENV_PERMITS, str(config.permits)))
        store_mounts = [
            {"name": contract.STORE_VOLUME_NAME, "mountPath": contract.STORE_DIR, "readOnly": True},
            {
                "name": contract.SUCCESS_VOLUME_NAME,
                "mountPath": contract.SUCCESS_DIR,
                "readOnly": True,
            },
        ]
    return {
        "name": contract.SIDECAR_CONTAINER,
        "image": image,
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
            *bound_env,
            _env(contract.ENV_SKEW, format_duration(config.skew_seconds)),
            _env(contract.ENV_PORT, str(contract.SIDECAR_PORT)),
            _env(contract.ENV_RUN_DIR, contract.RUN_DIR),
            _env(contract.ENV_OPERATOR_VERSION, contract.VERSION),
            _field_env(contract.ENV_POD_NAME, "metadata.name"),
            _field_env(contract.ENV_POD_UID, "metadata.uid"),
            _field_env(contract.ENV_POD_NAMESPACE, "metadata.namespace"),
            _field_env(contract.ENV_JOB_NAME, f"metadata.labels['{contract.JOB_NAME_LABEL}']"),
            *tick_env,
            *store_env,
            *jitter_env,
        ],
        "resources": settings.sidecar_resources.as_spec(),
        "securityContext": security_context(uid, settings.sidecar_run_as_group),
        "volumeMounts": [
            {"name": contract.VOLUME_NAME, "mountPath": contract.RUN_DIR},
            *store_mounts,
        ],
    }


def store_volume(config: LockConfig) -> dict[str, Any]:
    """The store's Secret as a volume: its key `url` alone, as the file the sidecar reads."""
    return {
        "name": contract.STORE_VOLUME_NAME,
        "secret": {
            "secretName": config.store_secret,
            "items": [
                {"key": contract.STORE_SECRET_URL_KEY, "path": contract.STORE_SECRET_URL_KEY}
            ],
        },
    }


def gate_container(config: LockConfig, settings: OperatorSettings) -> dict[str, Any]:
    return {
        "name": contract.GATE_CONTAINER,
        "image": settings.sidecar_image,
        "imagePullPolicy": settings.sidecar_image_pull_policy,
        "command": list(GATE_COMMAND),
        "env": [
            _env(contract.ENV_RUN_DIR, contract.RUN_DIR),
            _env(contract.ENV_WAIT_TIMEOUT, format_duration(config.wait_timeout_seconds)),
            # The gate waits for the sidecar's decision, which comes after the jitter.
            *_jitter_env(config),
        ],
        "resources": settings.sidecar_resources.as_spec(),
        "securityContext": security_context(
            settings.sidecar_run_as_user, settings.sidecar_run_as_group
        ),
        "volumeMounts": [{"name": contract.VOLUME_NAME, "mountPath": contract.RUN_DIR}],
    }


def _jitter_env(config: LockConfig) -> list[dict[str, Any]]:
    """CRONLOCK_JITTER where the CronJob asks for one, in whole milliseconds where it is
    not whole seconds (`format_duration` would print 6 significant digits)."""
    seconds = config.jitter_seconds
    if seconds <= 0:
        return []
    text = format_duration(seconds) if seconds.is_integer() else f"{round(seconds * 1000)}ms"
    return [_env(contract.ENV_JITTER, text)]


def held_probe(config: LockConfig) -> dict[str, Any]:
    return {
        "httpGet": {"path": contract.HELD_PATH, "port": contract.SIDECAR_PORT},
        "periodSeconds": PROBE_PERIOD_SECONDS,
        "failureThreshold": config.probe.failure_threshold,
        "timeoutSeconds": config.probe.timeout_seconds,
        "terminationGracePeriodSeconds": config.kill_grace_seconds,
    }


def security_context(uid: int | None, gid: int | None) -> dict[str, Any]:
    """Restricted; an id that is None is left out, for the platform to assign."""
    ids = {"runAsUser": uid, "runAsGroup": gid}
    return {
        "runAsNonRoot": True,
        **{field: value for field, value in ids.items() if value is not None},
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def _field_env(name: str, field_path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": field_path}}}


def is_injected_container(container: Mapping[str, Any]) -> bool:
    command = container.get("command") or []
    return container.get("name") in contract.INJECTED_CONTAINERS and tuple(command) in (
        SIDECAR_COMMAND,
        GATE_COMMAND,
    )


def is_skip_rule(rule: Mapping[str, Any]) -> bool:
    exit_codes: Mapping[str, Any] = rule.get("onExitCodes") or {}
    return (
        rule.get("action") == "FailJob"
        and exit_codes.get("containerName") == contract.GATE_CONTAINER
        and exit_codes.get("operator") == "In"
        and exit_codes.get("values") == [contract.EXIT_SKIPPED]
    )


def defaults_as_injected(cronjob: Mapping[str, Any], settings: LockDefaults) -> LockDefaults:
    """`settings` with the lock defaults the operator's injection into this CronJob shows
    (ttl, renew, policy, skew): a reader that did not run the operator (`cronlock status`)
    then reads the CronJob's annotations as the operator did, whatever `--default-ttl`,
    `--default-renew`, `--default-policy` and `--skew` it ran with. An annotation the
    CronJob sets wins over its default either way, so taking the injected values as the
    defaults changes only what the annotations leave out. `settings` as they are where
    nothing is injected or the injected values do not read as the operator writes them."""
    env = _injected_sidecar_env(cronjob)
    if env is None:
        return settings
    policy = next(
        (known for known in get_args(Policy) if known == env.get(contract.ENV_POLICY)), None
    )
    try:
        ttl = parse_duration(str(env[contract.ENV_TTL]))
        skew = parse_duration(str(env[contract.ENV_SKEW]))
        if policy is None or not (ttl.is_integer() and skew.is_integer()):
            return settings
        return dataclasses.replace(
            settings,
            default_ttl_seconds=int(ttl),
            default_renew_seconds=parse_duration(str(env[contract.ENV_RENEW])),
            default_policy=policy,
            skew_seconds=int(skew),
        )
    except (KeyError, ValueError):  # DurationError is a ValueError; so is a refused default
        return settings


def injected_by(cronjob: Mapping[str, Any]) -> str | None:
    """The release of the operator whose sidecar the job template carries (its
    CRONLOCK_OPERATOR_VERSION; contract.UNSTAMPED_VERSION for an injection made before
    injections carried it); None where no sidecar is injected."""
    env = _injected_sidecar_env(cronjob)
    if env is None:
        return None
    return str(env.get(contract.ENV_OPERATOR_VERSION) or contract.UNSTAMPED_VERSION)


def _injected_sidecar_env(cronjob: Mapping[str, Any]) -> dict[Any, Any] | None:
    """The environment (name -> value) of the job template's cronlock sidecar; None if it
    has none."""
    init_containers = pod_spec_of(cronjob).get("initContainers") or []
    sidecar = next(
        (
            container
            for container in init_containers
            if isinstance(container, Mapping)
            and container.get("name") == contract.SIDECAR_CONTAINER
        ),
        None,
    )
    if sidecar is None:
        return None
    return {
        item.get("name"): item.get("value")
        for item in sidecar.get("env") or []
        if isinstance(item, Mapping)
    }
