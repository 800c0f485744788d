"""A CronJob's `cronlock.io/*` annotations, parsed and checked before anything is written.

Readers do not call `parse_config` themselves: they take `reading.read_config`, which
parses once per resourceVersion and applies the one rule for invalid input.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

from cronlock_operator.cronjob.invalid import InvalidConfig as InvalidConfig
from cronlock_operator.cronjob.invalid import duration_annotation
from cronlock_operator.cronjob.podspec import (
    DEFAULT_SERVICE_ACCOUNT,
    containers_with_own_liveness_probe,
    pod_spec_of,
    service_account_of,
)
from cronlock_operator.cronjob.policies import Policy, parse_policy, parse_wait_timeout
from cronlock_operator.leases.sharing import InvalidPeers, parse_peers
from cronlock_operator.objects import annotations_of
from cronlock_sidecar import contract
from cronlock_sidecar.lock.model import (
    Timing,
    TimingError,
    default_renew_ms,
    seconds_text,
)

Stop = Literal["liveness", "signal"]
Store = Literal["lease", "redis", "postgres"]

MIN_TTL_SECONDS: Final = 5
MAX_TTL_SECONDS: Final = 24 * 3600
# A renewal more often than once a second only loads the API server.
MIN_RENEW_SECONDS: Final = 1.0
MIN_ALERT_AFTER: Final = 1
MAX_ALERT_AFTER: Final = 1000
# cronlock.io/alert-after-missed: 0 turns NotSucceeding off for the CronJob.
MAX_ALERT_AFTER_MISSED: Final = 1000
# The liveness probe on user containers runs every second; the sidecar checks as often.
PROBE_PERIOD_SECONDS: Final = 1
# ... and a probe fails at the latest this long after it was sent (a frozen sidecar never
# answers). On the real kubelet the failure was seen up to 1.5s after the renew deadline,
# more than the probe period alone (docs/RELIABILITY.md).
PROBE_TIMEOUT_SECONDS: Final = 1
# Longer graces only delay the stop; the TTL has to cover it.
MAX_KILL_GRACE_SECONDS: Final = 10
# The kubelet never gives a container less than 2s to stop (minimumGracePeriodInSeconds
# in kuberuntime's killContainer): a smaller grace would be 2s in fact.
MIN_KILL_GRACE_SECONDS: Final = 2


@dataclass(frozen=True)
class ProbeTolerance:
    """How much the `/held` liveness probe forgives: its timeout and failure threshold."""

    timeout_seconds: int
    failure_threshold: int

    @property
    def detection_ms(self) -> int:
        """How late the kubelet can see a lost lease: up to one period until the next probe,
        then `failure_threshold` probes in a row, each failing within its timeout (a `503` at
        once, a frozen sidecar at the timeout; the kubelet sends the next probe as soon as
        one that outlasted the period has failed)."""
        each = max(self.timeout_seconds, PROBE_PERIOD_SECONDS)
        return (PROBE_PERIOD_SECONDS + self.failure_threshold * each) * 1000


# The probe that fits every valid TTL: one unanswered second stops the run.
STRICT_PROBE: Final = ProbeTolerance(PROBE_TIMEOUT_SECONDS, 1)
# How late the kubelet can see a lost lease with it: one probe period plus its timeout.
DETECTION_MS: Final = STRICT_PROBE.detection_ms
# Where the TTL has room beyond the kill grace, the probe forgives a slow answer: on a node
# starved of CPU the kubelet's 1 s probe timed out on sidecars that held and renewed their
# Leases, and stopped their runs (docs/RELIABILITY.md, "Found on the way"). Most forgiving
# first; the first that fits the TTL with the CronJob's kill grace is injected.
PROBE_TOLERANCES: Final = (ProbeTolerance(3, 2), ProbeTolerance(2, 2), STRICT_PROBE)

_LOCK = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_MAX_LOCK_LENGTH: Final = 63  # the lock is also the value of the label cronlock.io/lock
_MAX_SECRET_NAME_LENGTH: Final = 253  # a DNS subdomain, as Kubernetes names a Secret
_INTEGER = re.compile(r"[0-9]+")


class Defaults(Protocol):
    """The operator's defaults a CronJob's annotations are read under: what its flags (and
    so the chart) decide for every CronJob's lock. `OperatorSettings` (settings.py) is
    one; a reader that never injects (`cronlock status`, `cronlock lint`) takes a
    `LockDefaults` and nothing of images, UIDs or resources."""

    @property
    def default_ttl_seconds(self) -> int: ...

    # Used when a CronJob sets neither ttl nor renew; with its own ttl, renew is ttl/3.
    @property
    def default_renew_seconds(self) -> float | None: ...

    @property
    def default_policy(self) -> Policy: ...

    @property
    def skew_seconds(self) -> int: ...

    # Ticks without a successful run before `NotSucceeding` (cronlock.io/alert-after-missed
    # overrides it; 0: never).
    @property
    def default_alert_after_missed(self) -> int: ...

    # How long after its tick a run may start before the tick counts as missed, for a
    # CronJob without startingDeadlineSeconds (with one, that deadline).
    @property
    def missed_tolerance_seconds(self) -> int: ...

    # Whether a lock may be kept in Redis or PostgreSQL: the operator has the sidecar image
    # with their clients.
    @property
    def stores_allowed(self) -> bool: ...


@dataclass(frozen=True)
class LockDefaults:
    """The lock defaults alone (`Defaults`), the chart's unless given."""

    default_ttl_seconds: int = contract.DEFAULT_TTL_SECONDS
    default_renew_seconds: float | None = None
    default_policy: Policy = "skip"
    skew_seconds: int = contract.DEFAULT_SKEW_SECONDS
    default_alert_after_missed: int = contract.DEFAULT_ALERT_AFTER_MISSED
    missed_tolerance_seconds: int = 60
    stores_allowed: bool = True

    def __post_init__(self) -> None:
        check_defaults(self)


def check_defaults(defaults: Defaults) -> None:
    """ValueError naming the first default no CronJob could be guarded under."""
    if defaults.default_policy not in contract.POLICIES:
        raise ValueError(
            f"default policy {defaults.default_policy!r} is not one of "
            + ", ".join(contract.POLICIES)
        )
    if defaults.skew_seconds < 0:
        raise ValueError(f"clock skew {defaults.skew_seconds}s must not be negative")
    if not 0 <= defaults.default_alert_after_missed <= MAX_ALERT_AFTER_MISSED:
        raise ValueError(
            f"alert after missed {defaults.default_alert_after_missed} is not a number of "
            f"ticks from 0 (never) to {MAX_ALERT_AFTER_MISSED}"
        )
    if not 1 <= defaults.missed_tolerance_seconds <= 86400:
        raise ValueError(
            f"missed tolerance {defaults.missed_tolerance_seconds}s is not from 1s to 24h"
        )
    try:
        ttl = _check_ttl(
            float(defaults.default_ttl_seconds), _format_seconds(defaults.default_ttl_seconds)
        )
        renew = defaults.default_renew_seconds
        if renew is None:
            renew = default_renew_seconds(ttl)
        _check_renew(ttl, renew, _format_seconds(renew), defaults.skew_seconds)
        kill_grace_seconds(ttl, defaults.skew_seconds, _format_seconds(ttl))
    except InvalidConfig as error:
        raise ValueError(f"operator default: {error}") from error


@dataclass(frozen=True)
class LockConfig:
    """How one CronJob's runs take their lock, resolved from its annotations and the settings."""

    lock: str
    ttl_seconds: int
    renew_seconds: float
    policy: Policy
    wait_timeout_seconds: float
    stop: Stop
    kill_grace_seconds: int
    alert_after: int
    keep_skipped_jobs: bool
    skew_seconds: int
    alert_after_missed: int = contract.DEFAULT_ALERT_AFTER_MISSED
    store: Store = "lease"
    # The `/held` probe's timeout and threshold (stop: liveness), from the TTL's room.
    probe: ProbeTolerance = STRICT_PROBE
    # The Secret (in the CronJob's namespace) whose key `url` is the store's URL.
    store_secret: str | None = None

    @property
    def shared_store(self) -> bool:
        """Whether the lock is in Redis or PostgreSQL, not this cluster's Lease."""
        return self.store != "lease"

    @property
    def lease_name(self) -> str:
        """The Lease in the CronJob's namespace that backs the lock."""
        return contract.lease_name(self.lock)

    @property
    def timing(self) -> Timing:
        return Timing.of(self.ttl_seconds, self.renew_seconds, self.skew_seconds)

    @property
    def renew_deadline_seconds(self) -> float:
        """How long the holder keeps running without a successful renewal."""
        return self.timing.renew_deadline


# Which rule decides whether a CronJob is guarded (`opt_in`), and the ones that guard it.
# "declined": enrolled by its namespace's label alone, but not guarded (`declined_because`).
OptIn = Literal["annotation", "namespace", "declined", "opted-out", "off"]
GUARDING: Final[frozenset[OptIn]] = frozenset({"annotation", "namespace"})


def opt_in(cronjob: Mapping[str, Any], namespace_labelled: bool = False) -> OptIn:
    """The rule that guards the CronJob, or keeps it unguarded. Its own annotation decides
    first: `cronlock.io/enabled: "true"` guards it ("annotation"), `"false"` keeps it out
    even in a labelled namespace ("opted-out"). Without the annotation, its namespace's label
    `cronlock.io/enabled: "true"` guards it ("namespace") unless `declined_because` says why
    the label alone cannot ("declined"); else it is "off". Any other annotation value raises
    InvalidConfig."""
    value = annotations_of(cronjob).get(contract.ANNOTATION_ENABLED)
    if value == "true":
        return "annotation"
    if value == "false":
        return "opted-out"
    if value is None:
        if not namespace_labelled:
            return "off"
        return "declined" if declined_because(cronjob) else "namespace"
    raise InvalidConfig(contract.ANNOTATION_ENABLED, value, 'is neither "true" nor "false"')


def declined_because(cronjob: Mapping[str, Any]) -> str | None:
    """Why the namespace's label alone does not guard this CronJob (None: it does).

    The label is the namespace admin's choice, not the CronJob author's, so it guards only
    what costs the CronJob's pods and their neighbours nothing they did not ask for:
    - a guard grants the runs' ServiceAccount the lock's Lease. `default` is the account of
      every pod in the namespace that names none (a web app that had no RBAC at all): any
      of them could claim the free Lease and keep it, and every run would skip. An account
      of the CronJob's own is granted; the operator also breaks a hold taken by a pod that
      is no run of the lock (reconcile/holders.py), whatever its account.
    - `stop: auto` with the containers' own livenessProbe resolves to `signal`, which
      shares the pod's process namespace: isolation its author never gave up.
    """
    account = service_account_of(cronjob)
    if account == DEFAULT_SERVICE_ACCOUNT:
        return (
            f"its pods run as the ServiceAccount {DEFAULT_SERVICE_ACCOUNT!r}, which every pod "
            "of the namespace that names none runs as; guarding it would let any of them "
            "hold its lock, so every run would skip"
        )
    stop = annotations_of(cronjob).get(contract.ANNOTATION_STOP, "auto")
    probed = containers_with_own_liveness_probe(cronjob)
    if stop == "auto" and probed:
        return (
            "container(s) " + ", ".join(probed) + " have their own livenessProbe, so "
            f"{contract.ANNOTATION_STOP}: auto would resolve to signal and share the pod's "
            "process namespace between its containers, which its author did not ask for"
        )
    return None


def declined_message(cronjob: Mapping[str, Any]) -> str:
    """The Warning for a CronJob its namespace's label does not guard: why, and what guards
    it."""
    why = declined_because(cronjob) or "the namespace's label alone does not guard it"
    return (
        f"not guarded although its namespace is labelled {contract.LABEL_NAMESPACE_ENABLED}="
        f"true: {why}. To guard it, give it a ServiceAccount of its own (serviceAccountName, "
        f'used by no other pod) or annotate it {contract.ANNOTATION_ENABLED}: "true" '
        "(docs/USAGE.md, namespace opt-in); its runs go on unguarded, as written"
    )


def parse_config(cronjob: Mapping[str, Any], settings: Defaults) -> LockConfig:
    """The CronJob's lock settings; raises InvalidConfig naming the first bad annotation."""
    annotations = annotations_of(cronjob)
    _refuse_unknown(annotations)
    opt_in(cronjob)
    store, store_secret = parse_store(annotations, settings)

    lock = _parse_lock(annotations, cronjob)

    ttl_text = annotations.get(contract.ANNOTATION_TTL)
    if ttl_text is None:
        ttl = settings.default_ttl_seconds
        ttl_shown = f"{_format_seconds(ttl)} (the operator's default)"
    else:
        ttl = _check_ttl(duration_annotation(contract.ANNOTATION_TTL, ttl_text), ttl_text)
        ttl_shown = ttl_text

    renew_text = annotations.get(contract.ANNOTATION_RENEW)
    if renew_text is not None:
        renew = duration_annotation(contract.ANNOTATION_RENEW, renew_text)
        _check_renew(ttl, renew, renew_text, settings.skew_seconds)
    elif ttl_text is None and settings.default_renew_seconds is not None:
        renew = settings.default_renew_seconds
    else:
        renew = default_renew_seconds(ttl)

    policy = parse_policy(annotations, settings.default_policy)
    wait_timeout = parse_wait_timeout(
        annotations, policy, Timing.of(ttl, renew, settings.skew_seconds)
    )
    stop = _parse_stop(annotations, cronjob)
    if stop == "signal" and store != "lease":
        _refuse_signal_with_store(annotations, cronjob, store)
    if store != "lease":
        _refuse_shared_processes_with_store(annotations, cronjob, store)
    alert_after = parse_alert_after(annotations)
    alert_after_missed = parse_alert_after_missed(annotations, settings.default_alert_after_missed)
    keep = parse_flag(annotations, contract.ANNOTATION_KEEP_SKIPPED_JOBS, default=False)
    try:
        parse_peers(annotations)
    except InvalidPeers as error:
        text = annotations[contract.ANNOTATION_SHARE_LOCK_WITH]
        raise InvalidConfig(contract.ANNOTATION_SHARE_LOCK_WITH, text[:200], str(error)) from None
    kill_grace = kill_grace_seconds(ttl, settings.skew_seconds, ttl_shown)

    return LockConfig(
        lock=lock,
        ttl_seconds=ttl,
        renew_seconds=renew,
        policy=policy,
        wait_timeout_seconds=wait_timeout,
        stop=stop,
        kill_grace_seconds=kill_grace,
        alert_after=alert_after,
        keep_skipped_jobs=keep,
        skew_seconds=settings.skew_seconds,
        alert_after_missed=alert_after_missed,
        store=store,
        store_secret=store_secret,
        probe=probe_tolerance(ttl, settings.skew_seconds, kill_grace),
    )


def default_renew_seconds(ttl_seconds: int) -> float:
    """A third of the TTL, rounded down to the millisecond so that it prints short."""
    return default_renew_ms(ttl_seconds * 1000) / 1000


def kill_grace_seconds(ttl_seconds: int, skew_seconds: int, ttl_shown: str) -> int:
    """The longest whole grace (at most 10s) that stops a run before its Lease can expire.

    A run that lost its lease must be gone before another run may take the lock:
    renew deadline + probe period + probe timeout + kill grace + clock skew < ttl, strictly
    (the lock model's `Timing.kill_grace_fits`).
    """
    timing = Timing.of(ttl_seconds, skew=skew_seconds)
    grace = timing.longest_kill_grace(
        DETECTION_MS, step_ms=1000, most_ms=MAX_KILL_GRACE_SECONDS * 1000
    )
    if grace is None or grace < MIN_KILL_GRACE_SECONDS * 1000:
        raise InvalidConfig(
            contract.ANNOTATION_TTL,
            ttl_shown,
            "is too short to stop a run that lost its lease before another run may take it: "
            f"renew deadline ({seconds_text(timing.renew_deadline * 1000)}, 2/3 of the ttl) "
            f"+ probe period ({PROBE_PERIOD_SECONDS}s) + probe timeout "
            f"({PROBE_TIMEOUT_SECONDS}s) + kill grace (at least "
            f"{MIN_KILL_GRACE_SECONDS}s) + clock skew ({skew_seconds}s) must stay under the ttl; "
            f"use a ttl of at least {minimum_ttl_seconds(skew_seconds)}s",
        )
    return grace // 1000


def probe_tolerance(ttl_seconds: int, skew_seconds: int, kill_grace: int) -> ProbeTolerance:
    """The most forgiving probe that still stops a run that lost its lease, with its kill
    grace, before another run may take the lock (as `kill_grace_seconds` reckons)."""
    timing = Timing.of(ttl_seconds, skew=skew_seconds)
    for probe in PROBE_TOLERANCES:
        if timing.kill_grace_fits(kill_grace * 1000, probe.detection_ms):
            return probe
    return STRICT_PROBE  # kill_grace_seconds chose the grace so that this one fits


def minimum_ttl_seconds(skew_seconds: int) -> int:
    """The shortest whole TTL that leaves room for the smallest kill grace."""
    ttl = MIN_TTL_SECONDS
    while not Timing.of(ttl, skew=skew_seconds).kill_grace_fits(
        MIN_KILL_GRACE_SECONDS * 1000, DETECTION_MS
    ):
        ttl += 1
    return ttl


def _refuse_unknown(annotations: Mapping[str, str]) -> None:
    known = contract.USER_SETTINGS | contract.OPERATOR_OWNED
    for key in sorted(annotations):
        if key.startswith(contract.PREFIX) and key not in known:
            close = difflib.get_close_matches(key, sorted(contract.USER_SETTINGS), n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise InvalidConfig(
                key,
                None,
                f"is not a cronlock annotation; {hint}expected one of "
                + ", ".join(sorted(contract.USER_SETTINGS)),
            )


def parse_store(annotations: Mapping[str, str], settings: Defaults) -> tuple[Store, str | None]:
    """`cronlock.io/store` (default the Lease) and, for Redis or PostgreSQL, the Secret
    named by `cronlock.io/store-secret` that holds its URL (key `url`).

    A CronJob that asks for Redis or PostgreSQL wants one lock across clusters: it is
    refused when this operator cannot inject that store, never quietly guarded by this
    cluster's Lease, whose runs would overlap the other cluster's.
    """
    store = annotations.get(contract.ANNOTATION_STORE, "lease")
    secret = annotations.get(contract.ANNOTATION_STORE_SECRET)
    if store not in contract.STORES:
        raise InvalidConfig(
            contract.ANNOTATION_STORE, store, f"is not one of {', '.join(contract.STORES)}"
        )
    if store == "lease":
        if secret is not None:
            raise InvalidConfig(
                contract.ANNOTATION_STORE_SECRET,
                secret,
                "names a store's Secret, but the lock is a Lease; set cronlock.io/store to "
                "redis or postgres, or remove it (docs/STORES.md)",
            )
        return "lease", None
    if secret is None:
        raise InvalidConfig(
            contract.ANNOTATION_STORE,
            store,
            f"needs cronlock.io/store-secret: the name of a Secret in this namespace whose "
            f"key {contract.STORE_SECRET_URL_KEY!r} holds the {store} URL (docs/STORES.md)",
        )
    if len(secret) > _MAX_SECRET_NAME_LENGTH or not _LOCK.fullmatch(secret):
        raise InvalidConfig(
            contract.ANNOTATION_STORE_SECRET,
            secret[:_MAX_SECRET_NAME_LENGTH],
            "is not a Secret name; expected at most 253 lowercase letters, digits, '-' and "
            "'.', starting and ending with a letter or digit",
        )
    if not settings.stores_allowed:
        raise InvalidConfig(
            contract.ANNOTATION_STORE,
            store,
            "needs the sidecar image with the store clients, which this operator was not "
            "given (flag --sidecar-stores-image, chart value sidecarStoresImage)",
        )
    return ("redis" if store == "redis" else "postgres"), secret


def _parse_lock(annotations: Mapping[str, str], cronjob: Mapping[str, Any]) -> str:
    value = annotations.get(contract.ANNOTATION_LOCK)
    origin = ""
    if value is None:
        metadata: Mapping[str, Any] = cronjob.get("metadata") or {}
        value = str(metadata.get("name", ""))
        origin = "(the CronJob's name, the default lock) "
    if len(value) > _MAX_LOCK_LENGTH or not _LOCK.fullmatch(value):
        raise InvalidConfig(
            contract.ANNOTATION_LOCK,
            value,
            f"{origin}is not a lock name; expected at most 63 lowercase letters, digits, "
            "'-' and '.', starting and ending with a letter or digit (it names the Lease "
            f"{contract.LEASE_PREFIX}<lock> and is the value of the label {contract.LABEL_LOCK})",
        )
    return value


def _check_ttl(seconds: float, text: str) -> int:
    if not MIN_TTL_SECONDS <= seconds <= MAX_TTL_SECONDS:
        raise InvalidConfig(
            contract.ANNOTATION_TTL,
            text,
            f"is out of range; expected a duration from {MIN_TTL_SECONDS}s to 24h",
        )
    if not seconds.is_integer():
        raise InvalidConfig(
            contract.ANNOTATION_TTL,
            text,
            "is not a whole number of seconds, which the Lease's leaseDurationSeconds needs; "
            f"expected for example {math.ceil(seconds)}s",
        )
    return int(seconds)


def _check_renew(ttl: int, renew: float, text: str, skew_seconds: int) -> None:
    annotation = contract.ANNOTATION_RENEW
    if renew >= ttl:
        raise InvalidConfig(
            annotation, text, f"must be shorter than the ttl ({_format_seconds(ttl)})"
        )
    if renew < MIN_RENEW_SECONDS:
        raise InvalidConfig(
            annotation, text, "is too short; renew at most once a second (expected at least 1s)"
        )
    try:
        Timing.of(ttl, renew, skew_seconds).check()
    except TimingError as error:
        raise InvalidConfig(annotation, text, error.reason) from None


def _parse_stop(annotations: Mapping[str, str], cronjob: Mapping[str, Any]) -> Stop:
    value = annotations.get(contract.ANNOTATION_STOP, "auto")
    probed = containers_with_own_liveness_probe(cronjob)
    if value == "auto":
        return "signal" if probed else "liveness"
    if value == "signal":
        return "signal"
    if value == "liveness":
        if probed:
            raise InvalidConfig(
                contract.ANNOTATION_STOP,
                value,
                "cannot be used: container(s) "
                + ", ".join(probed)
                + " already have a livenessProbe, which cronlock would have to replace; "
                'use "signal" or "auto"',
            )
        return "liveness"
    raise InvalidConfig(
        contract.ANNOTATION_STOP,
        value,
        'is not a stop method; expected "liveness", "signal" or "auto"',
    )


def _refuse_signal_with_store(
    annotations: Mapping[str, str], cronjob: Mapping[str, Any], store: str
) -> None:
    """`stop: signal` shares the pod's process namespace and runs the sidecar as the work's
    UID, so the work could read the store's URL, password included, through
    /proc/<sidecar pid>/root/var/run/cronlock-store/url: with a store, only `liveness`."""
    value = annotations.get(contract.ANNOTATION_STOP, "auto")
    why = (
        "resolves to signal, since container(s) "
        + ", ".join(containers_with_own_liveness_probe(cronjob))
        + " have their own livenessProbe, and "
        if value == "auto"
        else ""
    )
    raise InvalidConfig(
        contract.ANNOTATION_STOP,
        value,
        f"{why}cannot be used with {contract.ANNOTATION_STORE}: {store}: under stop: signal "
        "the sidecar shares the pod's process namespace and runs as your containers' user, so "
        "your work could read the store's URL and password through /proc/<sidecar pid>/root; "
        f'set {contract.ANNOTATION_STOP}: "liveness" (and remove your own livenessProbe, '
        "which cronlock's replaces) or keep the lock in this cluster's Lease",
    )


def _refuse_shared_processes_with_store(
    annotations: Mapping[str, str], cronjob: Mapping[str, Any], store: str
) -> None:
    """`shareProcessNamespace: true` lets the work see the sidecar's processes; work that
    runs as the sidecar's user (65532, the user of distroless and Chainguard images too)
    could read the store's URL, password included, through /proc/<sidecar pid>/root
    (security review L-N12). The store's secret stays out of such a pod. (Also when an
    earlier `stop: signal` injection set it: the refusal reverts that injection, and the
    reverted CronJob is guarded. A recorded original is no exemption: anyone who edits the
    CronJob can write one.)"""
    if pod_spec_of(cronjob).get("shareProcessNamespace") is not True:
        return
    raise InvalidConfig(
        contract.ANNOTATION_STORE,
        store,
        "cannot be used in a pod with shareProcessNamespace: true: its containers see the "
        "sidecar's processes, and one running as the sidecar's user could read the store's "
        "URL and password through /proc/<sidecar pid>/root; remove shareProcessNamespace "
        "from the job template or keep the lock in this cluster's Lease",
    )


def parse_alert_after(annotations: Mapping[str, str]) -> int:
    value = annotations.get(contract.ANNOTATION_ALERT_AFTER)
    if value is None:
        return contract.DEFAULT_ALERT_AFTER
    # The length first: int() refuses more than 4,300 digits with a plain ValueError.
    if (
        len(value) > len(str(MAX_ALERT_AFTER))
        or not _INTEGER.fullmatch(value)
        or not MIN_ALERT_AFTER <= int(value) <= MAX_ALERT_AFTER
    ):
        raise InvalidConfig(
            contract.ANNOTATION_ALERT_AFTER,
            value,
            f"is not a number of skips; expected a whole number from {MIN_ALERT_AFTER} "
            f"to {MAX_ALERT_AFTER}",
        )
    return int(value)


def parse_alert_after_missed(annotations: Mapping[str, str], default: int) -> int:
    value = annotations.get(contract.ANNOTATION_ALERT_AFTER_MISSED)
    if value is None:
        return default
    if (
        len(value) > len(str(MAX_ALERT_AFTER_MISSED))
        or not _INTEGER.fullmatch(value)
        or not 0 <= int(value) <= MAX_ALERT_AFTER_MISSED
    ):
        raise InvalidConfig(
            contract.ANNOTATION_ALERT_AFTER_MISSED,
            value,
            "is not a number of ticks without a successful run; expected a whole number "
            f"from 0 (never warn) to {MAX_ALERT_AFTER_MISSED}",
        )
    return int(value)


def parse_flag(annotations: Mapping[str, str], annotation: str, *, default: bool) -> bool:
    value = annotations.get(annotation)
    if value is None:
        return default
    if value in ("true", "false"):
        return value == "true"
    raise InvalidConfig(annotation, value, 'is neither "true" nor "false"')


def _format_seconds(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole}s" if whole == seconds else f"{seconds:g}s"
