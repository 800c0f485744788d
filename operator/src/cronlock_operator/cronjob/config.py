"""A CronJob's `cronlock.io/*` annotations, parsed and checked before anything is written.

Readers do not call `parse_config` themselves: they take `reading.read_config`, which
parses once per resourceVersion and applies the one rule for invalid input.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from cronlock_operator.cronjob.defaults import MAX_ALERT_AFTER_MISSED, Defaults
from cronlock_operator.cronjob.invalid import InvalidConfig as InvalidConfig
from cronlock_operator.cronjob.invalid import duration_annotation
from cronlock_operator.cronjob.podspec import (
    DEFAULT_SERVICE_ACCOUNT,
    containers_with_own_liveness_probe,
    pod_spec_of,
    service_account_of,
)
from cronlock_operator.cronjob.policies import (
    Policy,
    parse_max_hold,
    parse_policy,
    parse_queue_timeout,
    parse_wait_timeout,
)
from cronlock_operator.cronjob.timing import (
    STRICT_PROBE,
    ProbeTolerance,
    check_renew,
    check_ttl,
    default_renew_seconds,
    format_seconds,
    kill_grace_seconds,
    probe_tolerance,
)
from cronlock_operator.leases.sharing import InvalidPeers, parse_peers
from cronlock_operator.objects import annotations_of
from cronlock_sidecar import contract
from cronlock_sidecar.lock.model import Timing
from cronlock_sidecar.lock.permits import read_count
from cronlock_sidecar.lock.schedule import min_gap_seconds

Stop = Literal["liveness", "signal"]
Store = Literal["lease", "redis", "postgres"]

MIN_ALERT_AFTER: Final = 1
MAX_ALERT_AFTER: Final = 1000


_LOCK = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_MAX_LOCK_LENGTH: Final = 63  # the lock is also the value of the label cronlock.io/lock
_MAX_SECRET_NAME_LENGTH: Final = 253  # a DNS subdomain, as Kubernetes names a Secret
_INTEGER = re.compile(r"[0-9]+")


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
    # The CronJobs of its namespace it lets use its lock (`cronlock.io/share-lock-with`).
    peers: frozenset[str] = frozenset()
    # policy: queue: how long a Job may stay queued, then its pod wait (0 otherwise).
    queue_timeout_seconds: float = 0.0
    # The longest a run may hold the lock from its acquire (`cronlock.io/max-hold`); 0: none.
    max_hold_seconds: float = 0.0
    # How many runs may hold the lock at once (`cronlock.io/permits`): the lock's N.
    permits: int = 1
    # The longest delay before a run takes its lock (`cronlock.io/jitter`); 0: none.
    jitter_seconds: float = 0.0

    @property
    def shared_store(self) -> bool:
        """Whether the lock is in Redis or PostgreSQL, not this cluster's Lease."""
        return self.store != "lease"

    @property
    def kept_in(self) -> tuple[str, str]:
        """Where the lock is kept, as `leases.sharing.where_kept` reads it from a CronJob's
        annotations: (store, Secret), ("lease", "") for the Lease itself."""
        return (self.store, self.store_secret or "")

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
        ttl_shown = f"{format_seconds(ttl)} (the operator's default)"
    else:
        ttl = check_ttl(duration_annotation(contract.ANNOTATION_TTL, ttl_text), ttl_text)
        ttl_shown = ttl_text

    renew_text = annotations.get(contract.ANNOTATION_RENEW)
    if renew_text is not None:
        renew = duration_annotation(contract.ANNOTATION_RENEW, renew_text)
        check_renew(ttl, renew, renew_text, settings.skew_seconds)
    elif ttl_text is None and settings.default_renew_seconds is not None:
        renew = settings.default_renew_seconds
    else:
        renew = default_renew_seconds(ttl)

    policy = parse_policy(annotations, settings.default_policy)
    wait_timeout = parse_wait_timeout(
        annotations, policy, Timing.of(ttl, renew, settings.skew_seconds)
    )
    schedule = (cronjob.get("spec") or {}).get("schedule")
    queue_timeout = parse_queue_timeout(
        annotations, policy, min_gap_seconds(schedule) if isinstance(schedule, str) else None
    )
    if policy == "queue":
        if store != "lease":
            raise InvalidConfig(
                contract.ANNOTATION_POLICY,
                "queue",
                f"needs the lock in a Lease ({contract.ANNOTATION_STORE}: lease): the operator "
                f"lets a queued Job go when it sees the Lease released, and a lock in {store} "
                "is out of its sight; use policy wait with a store",
            )
        wait_timeout = queue_timeout  # a let-go run that finds the lock taken waits as long
    max_hold = parse_max_hold(annotations, policy, Timing.of(ttl, renew, settings.skew_seconds))
    jitter = parse_jitter(annotations)
    stop = _parse_stop(annotations, cronjob)
    if stop == "signal" and store != "lease":
        _refuse_signal_with_store(annotations, cronjob, store)
    if store != "lease":
        _refuse_shared_processes_with_store(annotations, cronjob, store)
    alert_after = parse_alert_after(annotations)
    alert_after_missed = parse_alert_after_missed(annotations, settings.default_alert_after_missed)
    keep = parse_flag(annotations, contract.ANNOTATION_KEEP_SKIPPED_JOBS, default=False)
    try:
        peers = parse_peers(annotations)
    except InvalidPeers as error:
        text = annotations[contract.ANNOTATION_SHARE_LOCK_WITH]
        raise InvalidConfig(contract.ANNOTATION_SHARE_LOCK_WITH, text[:200], str(error)) from None
    permits = parse_permits(annotations)
    if permits > 1:
        _refuse_permits_with(annotations, policy)
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
        peers=peers,
        queue_timeout_seconds=queue_timeout,
        max_hold_seconds=max_hold,
        permits=permits,
        jitter_seconds=jitter,
    )


def parse_jitter(annotations: Mapping[str, str]) -> float:
    """`cronlock.io/jitter`: seconds, to the millisecond, from 0 (none, the default) to
    contract.MAX_JITTER_SECONDS. Longer would hold a pod, and its node's reservation for
    the job's requests, idle for more than an hour, and the gate waits for it."""
    text = annotations.get(contract.ANNOTATION_JITTER)
    if text is None:
        return 0.0
    seconds = duration_annotation(contract.ANNOTATION_JITTER, text)
    if seconds > contract.MAX_JITTER_SECONDS:
        raise InvalidConfig(
            contract.ANNOTATION_JITTER,
            text,
            "is out of range; expected a duration from 0 (no jitter) to 1h, the longest a "
            "run's pod may wait before it takes its lock",
        )
    return round(seconds, 3)


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


def parse_permits(annotations: Mapping[str, str]) -> int:
    """`cronlock.io/permits`: how many runs may hold the lock at once (absent: 1), read by
    the rule the sidecar reads the lock's N by (`permits.read_count`)."""
    value = annotations.get(contract.ANNOTATION_PERMITS)
    if value is None:
        return 1
    count = read_count(value)
    if count is None:
        raise InvalidConfig(
            contract.ANNOTATION_PERMITS,
            value[:64],
            f"is not a number of permits; expected a whole number from 1 to "
            f"{contract.MAX_PERMITS} (how many runs may hold the lock at once)",
        )
    return count


def _refuse_permits_with(annotations: Mapping[str, str], policy: Policy) -> None:
    """Permits above 1 the sidecar does not hold yet (docs/DECISIONS.md, "Permits in the
    sidecar, as built"): under `replace`, which of N holders to stop is not settled.
    Refused, not quietly guarded as something else. In Redis and PostgreSQL the stores'
    rules keep the permits (docs/DECISIONS.md, "Permits in a store")."""
    text = annotations[contract.ANNOTATION_PERMITS]
    if policy == "replace":
        raise InvalidConfig(
            contract.ANNOTATION_PERMITS,
            text,
            f'cannot be used with {contract.ANNOTATION_POLICY}: "replace" yet: which of the '
            "holders a replacing run should stop is not settled; use skip, wait or observe, "
            f"or remove {contract.ANNOTATION_PERMITS}",
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
