"""Read a finished Job: was it a run cronlock skipped, a run that succeeded, or neither?"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from cronlock_operator.objects import annotations_of
from cronlock_sidecar import contract

Outcome = Literal["skipped", "succeeded", "failed", "queue-timed-out"]
# Written on a Job once the operator has counted it, so a replayed event counts nothing.
ACCOUNTED_ANNOTATION = contract.PREFIX + "accounted"


def outcome(job: Mapping[str, Any]) -> Outcome | None:
    """The finished Job's outcome, or None while it runs. A queued Job the operator marked
    as queued too long (policy: queue) is finished too while it is still suspended: it
    never ran, and will not (a running Job with the mark is judged by its end alone)."""
    if contract.JOB_ANNOTATION_QUEUE_TIMED_OUT in annotations_of(job) and (
        (job.get("spec") or {}).get("suspend") is True
    ):
        return "queue-timed-out"
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return "succeeded"
        if condition.get("type") == "Failed":
            return "skipped" if is_skip_failure(condition) else "failed"
    return None


def is_skip_failure(condition: Mapping[str, Any]) -> bool:
    """The Job controller failed the Job through our podFailurePolicy rule (gate exit 75)."""
    message = str(condition.get("message") or "")
    return (
        condition.get("reason") == "PodFailurePolicy"
        and f"Container {contract.GATE_CONTAINER} " in message
        and f"exit code {contract.EXIT_SKIPPED}" in message
    )


# The Job controller's message for a pod failed by a podFailurePolicy rule:
# "Container cronlock-gate for pod <namespace>/<pod> failed with exit code 75 matching ...".
_SKIPPED_POD = re.compile(
    rf"Container {re.escape(contract.GATE_CONTAINER)} for pod ([a-z0-9][-a-z0-9.]*)/"
    rf"([a-z0-9][-a-z0-9.]*) failed with exit code {contract.EXIT_SKIPPED}\b"
)
# An Event's message carries at most this much of the gate's line (the kubelet keeps up to
# 4,096 bytes of a termination message; the sidecar's line is about 250 characters).
MAX_ALREADY_RAN_LINE = 1024


def skipped_pod(job: Mapping[str, Any]) -> str | None:
    """The pod the Job's Failed condition names as the one whose gate exited 75 (in the
    Job's own namespace), or None."""
    namespace = (job.get("metadata") or {}).get("namespace")
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") != "Failed" or not is_skip_failure(condition):
            continue
        match = _SKIPPED_POD.search(str(condition.get("message") or ""))
        if match is not None and match.group(1) == namespace:
            return match.group(2)
    return None


def already_ran_line(job: Mapping[str, Any], pod: Mapping[str, Any] | None) -> str | None:
    """The gate's `already ran: ...` line, when `pod` is one of `job`'s own pods whose gate
    exited 75 saying so in its termination message; None for any other skip (the lock was
    held), a pod of another Job, or a pod that is gone (None).

    The pod must name the Job, by its uid, as its controlling owner: a Job's Failed
    condition naming another Job's pod (anyone who may write Jobs' status can write it)
    borrows nothing. The line is cut at its first line and MAX_ALREADY_RAN_LINE
    characters, printable characters only: it goes into an Event."""
    if pod is None:
        return None
    uid = (job.get("metadata") or {}).get("uid")
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    if not uid or not any(
        isinstance(owner, Mapping)
        and owner.get("kind") == "Job"
        and owner.get("uid") == uid
        and owner.get("controller") is True
        for owner in owners
    ):
        return None
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if not isinstance(status, Mapping) or status.get("name") != contract.GATE_CONTAINER:
            continue
        for state in (status.get("state"), status.get("lastState")):
            terminated = (state or {}).get("terminated") if isinstance(state, Mapping) else None
            if not isinstance(terminated, Mapping):
                continue
            if terminated.get("exitCode") != contract.EXIT_SKIPPED:
                continue
            message = terminated.get("message")
            if not isinstance(message, str) or not message.startswith(contract.ALREADY_RAN + ":"):
                continue
            line = message.splitlines()[0][:MAX_ALREADY_RAN_LINE]
            return "".join(char if char.isprintable() else "?" for char in line).rstrip()
    return None


def max_hold_line(job: Mapping[str, Any], pod: Mapping[str, Any] | None) -> str | None:
    """The sidecar's `max-hold exceeded: ...` line, when `pod` is one of `job`'s own pods
    (its controlling owner, by uid, as already_ran_line asks) whose cronlock sidecar wrote it
    to its termination message on stopping the run at cronlock.io/max-hold; else None.

    Cut at its first line and MAX_ALREADY_RAN_LINE characters, printable characters only:
    it goes into an Event. (Under stop: signal the work shares the sidecar's user and could
    write that file too: it can only report or hide its own run's stop, docs/SECURITY.md.)"""
    if pod is None or not _owned_by(job, pod):
        return None
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if not isinstance(status, Mapping) or status.get("name") != contract.SIDECAR_CONTAINER:
            continue
        for state in (status.get("state"), status.get("lastState")):
            terminated = (state or {}).get("terminated") if isinstance(state, Mapping) else None
            if not isinstance(terminated, Mapping):
                continue
            message = terminated.get("message")
            if isinstance(message, str) and message.startswith(contract.MAX_HOLD_EXCEEDED + ":"):
                line = message.splitlines()[0][:MAX_ALREADY_RAN_LINE]
                return "".join(char if char.isprintable() else "?" for char in line).rstrip()
    return None


def _owned_by(job: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """The pod names the Job, by its uid, as its controlling owner."""
    uid = (job.get("metadata") or {}).get("uid")
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and any(
        isinstance(owner, Mapping)
        and owner.get("kind") == "Job"
        and owner.get("uid") == uid
        and owner.get("controller") is True
        for owner in owners
    )


def went_through_the_lock(job: Mapping[str, Any], cronjob: Mapping[str, Any]) -> bool:
    """The Job's pods pass cronlock's gate as the CronJob's runs do, so its success means
    its run held the lock.

    Anyone who may create Jobs can name a CronJob as a Job's owner (uid and `controller`
    included), so a Job that never took the lock (one container `true`) could end a run of
    skips and hide a stuck lock (security review L8). A container merely *named*
    `cronlock-gate` proved nothing either (L-N6): its image may be `true`, or a sidecar of
    the Job's own may write `run` into the gate's run dir. So cronlock's containers (the
    sidecar and the gate: image, command, environment, probes, mounts) and the volumes they
    mount must be exactly the CronJob's own, as the CronJob controller copies them. Such a
    Job's sidecar takes the CronJob's lock with the pod's own token; if the lock is stuck,
    its gate skips too. (A Job made before the operator injected the CronJob anew, after an
    upgrade or a change of its annotations, does not end a run of skips: the next does.)"""
    ours = _cronlock_parts(_pod_spec(job))
    return bool(ours[0]) and ours == _cronlock_parts(
        _pod_spec(cronjob.get("spec", {}).get("jobTemplate"))
    )


def _pod_spec(job: Mapping[str, Any] | None) -> Mapping[str, Any]:
    template = ((job or {}).get("spec") or {}).get("template") or {}
    spec = template.get("spec") if isinstance(template, Mapping) else None
    return spec if isinstance(spec, Mapping) else {}


def _cronlock_parts(spec: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
    """cronlock's containers in the pod spec (in order, the gate first to be present) and
    the volumes they mount."""
    containers = [
        container
        for container in spec.get("initContainers") or []
        if isinstance(container, Mapping) and container.get("name") in contract.INJECTED_CONTAINERS
    ]
    if not any(container.get("name") == contract.GATE_CONTAINER for container in containers):
        return [], []
    mounted = {
        mount.get("name")
        for container in containers
        for mount in container.get("volumeMounts") or []
        if isinstance(mount, Mapping)
    }
    volumes = [
        volume
        for volume in spec.get("volumes") or []
        if isinstance(volume, Mapping) and volume.get("name") in mounted
    ]
    return containers, volumes


def contended(job: Mapping[str, Any]) -> str | None:
    """What the operator marked on the Job: its run "overlapped", or was "replaced"."""
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    if contract.JOB_ANNOTATION_REPLACED_BY in annotations:
        return "replaced"
    if contract.JOB_ANNOTATION_OVERLAPPED in annotations:
        return "overlapped"
    return None


def is_accounted(job: Mapping[str, Any]) -> bool:
    """The operator has already counted this Job (it wrote the mark before anything else)."""
    return ACCOUNTED_ANNOTATION in ((job.get("metadata") or {}).get("annotations") or {})


def owning_cronjob(job: Mapping[str, Any]) -> str | None:
    """The CronJob a Job was made from (scheduled or `kubectl create job --from`)."""
    for owner in (job.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("kind") == "CronJob" and str(owner.get("apiVersion", "")).startswith("batch/"):
            return str(owner["name"])
    return None


# More digits is no counter cronlock wrote (and int() refuses 4,301 digits).
MAX_COUNTER_DIGITS = 18


def consecutive_skips(cronjob: Mapping[str, Any]) -> int:
    """The skips in a row cronlock counted on the CronJob (0 when unset or not a counter):
    the one reading, for the operator and `cronlock status`."""
    value = annotations_of(cronjob).get(contract.ANNOTATION_CONSECUTIVE_SKIPS, "0").strip()
    if not value.isdigit() or len(value) > MAX_COUNTER_DIGITS:
        return 0
    return int(value)
