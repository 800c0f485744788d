"""The operator's verdict on manifests: its reconciler's decision on each CronJob, and lock
consent among them, as findings with the lines they are about.

Nothing is checked here that the operator does not check itself: each CronJob goes
through `reconcile.cronjobs.decide` (the annotations' one reading, the injection's
refusals, the TTL-longer-than-schedule warning), and CronJobs of one namespace naming
the same lock go through `leases.sharing.consent` as if each joined the Lease in turn.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from cronlock_operator.cronjob.reading import ConfigReading, Readings, read_config
from cronlock_operator.leases.ownership import new_lease, owner_reference
from cronlock_operator.leases.sharing import asked_permits, consent
from cronlock_operator.lint.documents import Manifest
from cronlock_operator.reconcile.cronjobs import LEFT_AS_IT_WAS, CronJobInput, decide
from cronlock_operator.settings import OperatorSettings
from cronlock_sidecar import contract

# "info": what `--guards` asks for, never a problem.
Severity = Literal["error", "warning", "info"]

# The Event reason the reconciler posts for a config it refuses; any other it posts warns.
REFUSED: Final = "InvalidConfig"
# The annotation a warning is about, for its line.
WARNING_ANNOTATIONS: Final = {"TTLLongerThanSchedule": contract.ANNOTATION_TTL}


@dataclass(frozen=True)
class Finding:
    """One problem, as `path:line: severity: message`."""

    path: str
    line: int
    severity: Severity
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.severity}: {self.message}"


@dataclass(frozen=True)
class _Guarded:
    """A CronJob the operator would guard: its body as the checks saw it, and its lock."""

    manifest: Manifest
    body: Mapping[str, Any]
    lock: str
    ttl_seconds: int


def is_cronjob(body: Mapping[str, Any]) -> bool:
    return body.get("kind") == "CronJob" and str(body.get("apiVersion", "")).startswith("batch/")


# What `--guards` says of each CronJob, by its reading's rule (config.opt_in).
GUARD_RULES: Final = {
    "annotation": f"guarded by its annotation {contract.ANNOTATION_ENABLED}",
    "namespace": f"guarded by its namespace's label {contract.LABEL_NAMESPACE_ENABLED}=true",
    "declined": (
        f"not guarded: its namespace's label {contract.LABEL_NAMESPACE_ENABLED}=true alone "
        "does not guard a CronJob on the account 'default' nor impose stop: signal"
    ),
    "opted-out": f'not guarded: annotated {contract.ANNOTATION_ENABLED}: "false"',
    "off": "not guarded: neither annotated nor in a labelled namespace",
    "invalid": f"not guarded: {contract.ANNOTATION_ENABLED} is invalid",
}


def is_labelled_namespace(body: Mapping[str, Any]) -> str | None:
    """The name of a Namespace object labelled cronlock.io/enabled=true, else None."""
    if body.get("kind") != "Namespace" or body.get("apiVersion") != "v1":
        return None
    metadata = body.get("metadata")
    if not isinstance(metadata, Mapping) or not isinstance(metadata.get("labels"), Mapping):
        return None
    if metadata["labels"].get(contract.LABEL_NAMESPACE_ENABLED) != "true":
        return None
    return str(metadata.get("name") or "") or None


def check(
    manifests: Iterable[Manifest],
    settings: OperatorSettings,
    namespace: str = "default",
    labelled: Iterable[str] = (),
    *,
    guards: bool = False,
) -> list[Finding]:
    """Findings on every CronJob of `manifests`, in their order; objects without a
    namespace are in `namespace`, as with `kubectl apply -n`. A CronJob without the
    annotation is guarded in a `labelled` namespace or one whose Namespace object among
    `manifests` is labelled cronlock.io/enabled=true; `guards` adds an info finding per
    CronJob saying which rule guards it."""
    manifests = list(manifests)
    findings: list[Finding] = []
    cronjobs: dict[str, dict[str, Mapping[str, Any]]] = {}  # namespace -> name -> body
    groups: dict[tuple[str, str], list[_Guarded]] = {}
    readings = Readings(
        labelled={
            *labelled,
            *(name for m in manifests if (name := is_labelled_namespace(m.body)) is not None),
        }
    )
    for manifest in manifests:
        if not is_cronjob(manifest.body):
            continue
        body = _as_served(manifest.body, namespace)
        if body is None:
            findings.append(
                _finding(
                    manifest,
                    None,
                    "error",
                    "is not a batch CronJob: it has no "
                    "metadata.name or no spec.jobTemplate; the API server would refuse it",
                )
            )
            continue
        # Read once (a file's CronJob has no uid for `readings` to keep it by).
        reading = read_config(body, settings, readings)
        found = _check_one(manifest, body, settings, readings, reading)
        findings.extend(found)
        metadata = body["metadata"]
        cronjobs.setdefault(metadata["namespace"], {})[metadata["name"]] = body
        if guards:
            rule = GUARD_RULES[reading.opt_in]
            findings.append(_finding(manifest, contract.ANNOTATION_ENABLED, "info", rule))
        config = reading.config
        if config is not None and not any(f.severity == "error" for f in found):
            groups.setdefault((metadata["namespace"], config.lock), []).append(
                _Guarded(manifest, body, config.lock, config.ttl_seconds)
            )
    for (space, lock), members in groups.items():
        findings.extend(_sharing(members, lock, cronjobs[space]))
    return findings


def _check_one(
    manifest: Manifest,
    body: Mapping[str, Any],
    settings: OperatorSettings,
    readings: Readings,
    reading: ConfigReading,
) -> list[Finding]:
    annotations: Mapping[str, Any] = body["metadata"].get("annotations") or {}
    if not isinstance(annotations, Mapping):
        return [_finding(manifest, None, "error", "metadata.annotations is not a mapping")]
    not_text = [
        key
        for key, value in annotations.items()
        if str(key).startswith(contract.PREFIX) and not isinstance(value, str)
    ]
    if not_text:
        return [
            _finding(
                manifest,
                key,
                "error",
                f"{key}: {_yaml_text(annotations[key])} is not a string; Kubernetes takes only "
                f'strings as annotation values: quote it ({key}: "{_yaml_text(annotations[key])}")',
            )
            for key in not_text
        ]
    try:
        decision = decide(CronJobInput(body), settings, readings=readings)
    except (KeyError, TypeError, AttributeError) as error:
        return [
            _finding(
                manifest,
                None,
                "error",
                f"cannot be read as a batch/v1 CronJob ({type(error).__name__}: {error}); "
                "the API server would refuse it",
            )
        ]
    findings = []
    for reason, message in decision.posted.items():
        if message is None:
            continue
        if reason == REFUSED:
            # An InvalidConfig's message starts with the annotation it is about.
            annotation = message.split(" ", 1)[0].removesuffix(":")
            text = message.removesuffix(LEFT_AS_IT_WAS)
            findings.append(_finding(manifest, annotation, "error", text))
        else:
            findings.append(_finding(manifest, WARNING_ANNOTATIONS.get(reason), "warning", message))
    # Neither its annotation nor its namespace's label guards it (config.opt_in's rule).
    if reading.opt_in == "off":
        settings_named = [
            key
            for key in annotations
            if key.startswith(contract.PREFIX) and key not in contract.OPERATOR_OWNED
        ]
        if settings_named:
            findings.append(
                _finding(
                    manifest,
                    settings_named[0],
                    "warning",
                    f"has {', '.join(settings_named)} but not {contract.ANNOTATION_ENABLED}: "
                    '"true", so the operator ignores it',
                )
            )
    return findings


def _sharing(
    members: list[_Guarded], lock: str, cronjobs: Mapping[str, Mapping[str, Any]]
) -> list[Finding]:
    """Refusals when no order of applying `members` lets each join the lock's Lease.

    The operator's rule (`consent`): the first user creates the Lease, each later one
    needs a user naming it in share-lock-with. The first user is the one that lets most
    of the others in (the earliest on a tie), since the cluster may apply them in any order.
    """
    if len(members) < 2:
        return []
    best: list[tuple[_Guarded, str]] | None = None
    for first in members:
        refused = _join_all(first, members, lock, cronjobs)
        if best is None or len(refused) < len(best):
            best = refused
    assert best is not None
    return [
        _finding(guarded.manifest, contract.ANNOTATION_LOCK, "error", reason)
        for guarded, reason in best
    ]


def _join_all(
    first: _Guarded,
    members: list[_Guarded],
    lock: str,
    cronjobs: Mapping[str, Mapping[str, Any]],
) -> list[tuple[_Guarded, str]]:
    """Who is refused when `first` creates the Lease and the others join while anyone may."""
    lease = new_lease(contract.lease_name(lock), first.body, lock, first.ttl_seconds)
    lease["metadata"]["namespace"] = first.body["metadata"]["namespace"]
    # The first user's N permits, as the operator writes it on the Lease it creates.
    count = asked_permits(first.body)
    if count is not None and count > 1:
        lease["metadata"]["annotations"] = {contract.ANNOTATION_PERMITS: str(count)}
    waiting = [member for member in members if member is not first]
    refused: list[tuple[_Guarded, str]] = []
    while waiting:
        refused = []
        for member in waiting:
            verdict = consent(lease, member.body, lock, cronjobs.get)
            if verdict.granted:
                lease["metadata"]["ownerReferences"].append(owner_reference(member.body))
            else:
                refused.append((member, verdict.reason))
        if len(refused) == len(waiting):
            break
        waiting = [member for member, _ in refused]
    return refused


def _as_served(body: Mapping[str, Any], namespace: str) -> dict[str, Any] | None:
    """The CronJob as the operator would get it: in a namespace, with a uid (one per
    namespace and name, so that the same CronJob in two files is one)."""
    metadata = body.get("metadata")
    spec = body.get("spec")
    if (
        not isinstance(metadata, Mapping)
        or not isinstance(metadata.get("name"), str)
        or not isinstance(spec, Mapping)
        or not isinstance(spec.get("jobTemplate"), Mapping)
    ):
        return None
    space = str(metadata.get("namespace") or namespace)
    served = {**metadata, "namespace": space, "uid": f"lint:{space}/{metadata['name']}"}
    served.pop("resourceVersion", None)  # read afresh: no reading memoized under it
    return {**body, "metadata": served}


def _finding(
    manifest: Manifest, annotation: str | None, severity: Severity, message: str
) -> Finding:
    metadata = manifest.body.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    space = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    who = f"{space}/{name}" if space and name else str(name or "(unnamed)")
    return Finding(
        manifest.path, manifest.line_of(annotation), severity, f"CronJob {who}: {message}"
    )


def _yaml_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
