"""The pod checker's pure parts: no cluster, no clock, so unit tests reach them.

They say whether an injected CronJob is whole and up to date, plan the faults, name how a
pod ended, find when a pod's Lease expired, and measure how soon the lock was used again
after a fault. `WorkRecords` counts what the work units wrote to their shared file.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cronlock_sidecar import contract
from cronlock_sidecar.lock.durations import DurationError, parse_duration
from tests.reliability.checker import Counts, EventsFile
from tests.reliability.pod_work import MAIN
from tests.support.node import LeaseVersion, PermitEntry, Work, container_state, exit_code

# --- what a consistent injection is ------------------------------------------------------------


def injection_problems(cronjob: Mapping[str, Any]) -> list[str]:
    """What is half-done in an injected CronJob: every injected piece must be there once.

    The notion of tests/integration/test_operator.py's operator-killed-mid-burst test: the
    sidecar and the gate first and once each, our podFailurePolicy rule first and once, the
    run-dir volume once and mounted once (read-only) in each container with its /held
    probe, restartPolicy Never, and the lock label on the Job and pod templates.
    """
    problems: list[str] = []
    annotations = (cronjob.get("metadata") or {}).get("annotations") or {}
    lock = annotations.get(contract.ANNOTATION_LOCK) or (cronjob.get("metadata") or {}).get("name")
    job_template = (cronjob.get("spec") or {}).get("jobTemplate") or {}
    job_spec = job_template.get("spec") or {}
    pod_template = job_spec.get("template") or {}
    pod_spec = pod_template.get("spec") or {}
    names = [str(c.get("name")) for c in pod_spec.get("initContainers") or []]
    if names[:2] != [contract.SIDECAR_CONTAINER, contract.GATE_CONTAINER]:
        problems.append(f"init containers {names}")
    for name in (contract.SIDECAR_CONTAINER, contract.GATE_CONTAINER):
        if names.count(name) > 1:
            problems.append(f"init container {name} {names.count(name)} times")
    rules = (job_spec.get("podFailurePolicy") or {}).get("rules") or []
    ours = [
        index
        for index, rule in enumerate(rules)
        if (rule.get("onExitCodes") or {}).get("containerName") == contract.GATE_CONTAINER
    ]
    if ours != [0]:
        problems.append(f"podFailurePolicy rules for {contract.GATE_CONTAINER} at {ours}")
    volumes = [v.get("name") for v in pod_spec.get("volumes") or []]
    if volumes.count(contract.VOLUME_NAME) != 1:
        problems.append(
            f"volume {contract.VOLUME_NAME} {volumes.count(contract.VOLUME_NAME)} times"
        )
    if pod_spec.get("restartPolicy") != "Never":
        problems.append(f"restartPolicy {pod_spec.get('restartPolicy')}")
    for container in pod_spec.get("containers") or []:
        mounts = [
            m for m in container.get("volumeMounts") or [] if m.get("name") == contract.VOLUME_NAME
        ]
        if len(mounts) != 1 or not mounts[0].get("readOnly"):
            problems.append(f"container {container.get('name')}: run-dir mounts {mounts}")
        probe = (container.get("livenessProbe") or {}).get("httpGet") or {}
        if probe.get("path") != contract.HELD_PATH:
            problems.append(f"container {container.get('name')}: no {contract.HELD_PATH} probe")
    for what, template in (("Job", job_template), ("pod", pod_template)):
        labels = (template.get("metadata") or {}).get("labels") or {}
        if labels.get(contract.LABEL_LOCK) != lock:
            problems.append(
                f"{what} template label {contract.LABEL_LOCK}={labels.get(contract.LABEL_LOCK)}"
            )
    return problems


def stale_settings(cronjob: Mapping[str, Any]) -> list[str]:
    """Where the injected sidecar does not (yet) say what the annotations ask: the ttl."""
    annotations = (cronjob.get("metadata") or {}).get("annotations") or {}
    wanted = annotations.get(contract.ANNOTATION_TTL)
    pod_spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    sidecars = [
        c
        for c in pod_spec.get("initContainers") or []
        if c.get("name") == contract.SIDECAR_CONTAINER
    ]
    if not sidecars or wanted is None:
        return [] if wanted is None else ["no sidecar"]
    env = {item["name"]: item.get("value") for item in sidecars[0].get("env") or []}
    injected = env.get(contract.ENV_TTL)
    try:
        same = injected is not None and parse_duration(injected) == parse_duration(wanted)
    except DurationError:
        same = False
    return [] if same else [f"sidecar {contract.ENV_TTL}={injected}, annotation ttl {wanted}"]


# --- the pure parts: the plan, how a pod ended, the Lease's expiry, recovery -------------------


def plan_faults(
    faults: Sequence[str], trials: int, per_trial: int, rng: random.Random
) -> list[list[str]]:
    """Every fault kind as evenly as `trials * per_trial` slots allow, in random order."""
    if not faults:
        return [[] for _ in range(trials)]
    kinds = [faults[i % len(faults)] for i in range(trials * per_trial)]
    rng.shuffle(kinds)
    return [kinds[i * per_trial : (i + 1) * per_trial] for i in range(trials)]


def outcome(pod: Mapping[str, Any] | None) -> str:
    """How a contender's pod ended, from its last status: its gate's decision, its work's exit."""
    if pod is None:
        return "no-pod"
    deleted = bool((pod.get("metadata") or {}).get("deletionTimestamp"))
    gate = exit_code(dict(pod), contract.GATE_CONTAINER)
    if gate is None:
        return "deleted-before-decision" if deleted else "no-decision"
    if gate == contract.EXIT_SKIPPED:
        return "skipped"
    if gate == contract.EXIT_UNAVAILABLE:
        return "unavailable"
    if gate != 0:
        return f"gate-{gate}"
    state = container_state(dict(pod), MAIN)
    terminated = state.get("terminated")
    if terminated is None:
        return "main-running" if "running" in state else "main-not-started"
    name = f"main-{terminated.get('exitCode')}"
    reason = terminated.get("reason")
    if reason not in (None, "Completed", "Error"):
        name += f" ({reason})"
    return name + (", pod deleted" if deleted and terminated.get("exitCode") != 0 else "")


def job_finished(job: Mapping[str, Any]) -> bool:
    """Whether the Job has a Complete or Failed condition."""
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions
    )


def job_of_pod(pod: str) -> str:
    """The Job a pod's name comes from (`<job>-<5 random characters>`)."""
    job, _, _ = pod.rpartition("-")
    return job


def holder_pod(identity: str) -> str:
    """The pod an injected sidecar's holder identity names (`<pod>_<uid[:8]>`)."""
    return contract.identity_pod(identity)


def entries(version: LeaseVersion) -> tuple[PermitEntry, ...]:
    """The version's permits; a version read without them is its spec, permit 0."""
    if version.permits:
        return version.permits
    return (PermitEntry(0, version.holder, version.renew_time, version.duration, 0),)


def _holds_entry(version: LeaseVersion, entry: PermitEntry, pod: str) -> bool:
    """`entry` names `pod` as holder, or is free with `pod` the holder just cleared."""
    if entry.holder:
        return holder_pod(entry.holder) == pod
    return bool(version.last_holder) and holder_pod(version.last_holder) == pod


def permits_held(versions: Sequence[LeaseVersion], pod: str) -> set[int]:
    """The permits `pod` was seen holding: one, unless it was seen on two (a defect)."""
    return {
        entry.number
        for version in versions
        for entry in entries(version)
        if entry.holder and holder_pod(entry.holder) == pod
    }


def lease_expiry(versions: Sequence[LeaseVersion], pod: str) -> float | None:
    """When the permit `pod` held expired, on this host's monotonic clock; None if never held.

    The latest renewTime + leaseDurationSeconds of a version held by the pod (with
    `cronlock.io/permits`, of the permit it held: the spec or its annotation). A release or
    an expiry clears the holder but keeps renewTime, so the version that cleared it counts.
    A pod seen only in a release is judged by permit 0 when the lock has one permit;
    with more, which one it held is unknown: None.
    """
    numbers = permits_held(versions, pod)
    if not numbers and all(len(entries(version)) == 1 for version in versions):
        numbers = {0}
    expiries = [
        entry.renew_time + entry.duration - version.offset
        for version in versions
        for entry in entries(version)
        if entry.number in numbers
        and _holds_entry(version, entry, pod)
        and entry.renew_time is not None
        and entry.duration is not None
    ]
    return max(expiries) if expiries else None


def lease_end(versions: Sequence[LeaseVersion], pod: str) -> str:
    """How `pod`'s hold on its permit of the Lease ended.

    `released` (its sidecar gave it back before it expired), `lost` (it expired: cleared by
    the operator, taken over, or given back too late), `held` (still its at the last version
    seen) or `never` (it never held it).
    """
    held = [
        (index, entry.number)
        for index, version in enumerate(versions)
        for entry in entries(version)
        if entry.holder and holder_pod(entry.holder) == pod
    ]
    if not held:
        return "never"
    last, number = held[-1]
    later = versions[last + 1 :]
    if not later:
        return "held"
    after = later[0]
    mine = [entry for entry in entries(after) if entry.number == number]
    expiry = lease_expiry(versions, pod)
    released = (
        bool(mine)
        and not mine[0].holder
        and holder_pod(after.last_holder) == pod
        and after.released_at is not None
        and expiry is not None
        and after.released_at - after.offset < expiry
    )
    return "released" if released else "lost"


def after_expiry(work: Work, versions: Sequence[LeaseVersion]) -> float | None:
    """How long after its pod's permit expired the work still ran (negative: stopped before).

    None while it runs, or when its pod never held a permit.
    """
    expiry = lease_expiry(versions, work.pod)
    if work.stopped is None or expiry is None:
        return None
    return work.stopped - expiry


def most_at_once(works: Sequence[Work]) -> int:
    """The most works that ran at one moment (a work that starts as another stops does not
    meet it, as in `crowded`): with N permits, N shows that the lock was used up to its
    bound, and more than N is an overlap."""
    edges = sorted(
        [(work.started, 1) for work in works]
        + [(work.stopped, 0) for work in works if work.stopped is not None]
    )
    running = most = 0
    for _, starts in edges:
        running += 1 if starts else -1
        most = max(most, running)
    return most


def token_regressions(versions: Sequence[LeaseVersion]) -> list[str]:
    """Each time a permit's fencing token (its transitions) went back, in watch order."""
    highest: dict[int, int] = {}
    found: list[str] = []
    for version in versions:
        for entry in version.permits:
            top = highest.get(entry.number, 0)
            if entry.transitions < top:
                found.append(f"permit {entry.number}: token {entry.transitions} after {top}")
            highest[entry.number] = max(top, entry.transitions)
    return found


def tokens_by_permit(versions: Sequence[LeaseVersion]) -> dict[int, int]:
    """Each permit's highest fencing token seen: how many holders it had."""
    highest: dict[int, int] = {}
    for version in versions:
        for entry in version.permits:
            highest[entry.number] = max(highest.get(entry.number, 0), entry.transitions)
    return dict(sorted(highest.items()))


def recovery_after(cleared: float, works: Sequence[Work]) -> float | None:
    """Seconds from when the lock was free of a fault's effects to the next work's start.

    The lock is free of it once the fault is cleared and every work that started before
    has stopped; None while no work has started since (or one from before still runs).
    """
    if not cleared:
        return None
    earlier = [work for work in works if work.started <= cleared]
    if any(work.stopped is None for work in earlier):
        return None
    free_from = max([cleared, *(work.stopped for work in earlier if work.stopped is not None)])
    later = [work.started for work in works if work.started > cleared]
    if not later:
        return None
    return max(0.0, min(later) - free_from)


class WorkRecords:
    """What a trial's work units wrote to their shared events file: clock-free counts."""

    def __init__(self, path: Path) -> None:
        self.events = EventsFile(path)
        self.counts: collections.Counter[str] = collections.Counter()
        # The same per permit the work held (its `permit` field; 0 for one holder).
        self.by_permit: dict[int, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )

    def read(self) -> None:
        for event in self.events.new_events():
            self.counts[event["event"]] += 1
            self.by_permit[int(event.get("permit") or 0)][event["event"]] += 1

    def permit_counts(self) -> dict[int, dict[str, int]]:
        """Per permit: works started, writes refused (a token that went back), overlaps."""
        return {
            permit: {
                "runs": counts["start"],
                "refused": counts["refused"],
                "overlaps": counts["overlap"],
            }
            for permit, counts in sorted(self.by_permit.items())
        }

    def tally(self, counts: Counts) -> None:
        self.read()
        counts.runs = self.counts["start"]
        counts.completed = self.counts["end"]
        counts.stopped = self.counts["start"] - self.counts["end"]
        counts.overlaps = self.counts["overlap"]
        counts.refused = self.counts["refused"]
