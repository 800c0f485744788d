"""The one reading of a CronJob's `cronlock.io/*` annotations, for every reader.

The CronJob and runs deciders, the pending guards and `cronlock status` all take the
`ConfigReading` of `read_config`, parsed once per resourceVersion, so they cannot disagree:
not on whether a CronJob is guarded, nor, when one annotation is invalid, on how its runs
are counted (the fallback rule is here, once).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from cronlock_operator.cronjob.config import (
    GUARDING,
    InvalidConfig,
    LockConfig,
    OptIn,
    parse_alert_after,
    parse_alert_after_missed,
    parse_config,
    parse_flag,
)
from cronlock_operator.cronjob.config import opt_in as read_opt_in  # `opt_in` is a field here
from cronlock_operator.cronjob.defaults import Defaults
from cronlock_operator.cronjob.policies import Policy
from cronlock_operator.objects import annotations_of
from cronlock_sidecar import contract


@dataclass(frozen=True)
class ConfigReading:
    """What a CronJob's annotations say, read once for every reader (`read_config`).

    The one rule for invalid input: a CronJob is guarded (`config`) only when it opted in
    and every annotation is valid; else `invalid` names the first bad one (or is None when
    it did not opt in, whose other annotations are not checked). What is shown or counted
    regardless — the counting settings, the lock and the policy — comes from the whole
    config when it is valid, else from each annotation on its own.
    """

    # Guarded by its annotation or its namespace's label (False also when the annotation is
    # neither "true" nor "false").
    enabled: bool
    config: LockConfig | None  # when enabled and valid
    invalid: InvalidConfig | None  # why an enabled CronJob is not guarded (or enabled is bad)
    # How runs are counted, from the config when it is valid, else each on its own and its
    # default only when it is the bad one: an unrelated bad annotation neither deletes
    # Jobs the user asked to keep nor moves `RepeatedSkips` (operator and status alike).
    alert_after: int
    keep_skipped_jobs: bool
    # Ticks without a success before NotSucceeding (0: never), by the same rule.
    alert_after_missed: int
    # What `cronlock status` shows: the config's lock and policy; without a valid config,
    # the annotated lock (else the CronJob's name) and the annotated policy (else the
    # default), "invalid" when the annotation names no policy.
    lock: str
    policy: Policy | Literal["invalid"]
    # The rule that decided `enabled` (config.opt_in), "invalid" for a bad annotation value.
    opt_in: OptIn | Literal["invalid"] = "off"


# CronJobs (times the settings they are read under) whose reading is kept; the one used
# longest ago goes first.
READINGS_KEPT: Final = 4096


# What a reading depends on beyond the settings: the CronJob's resourceVersion and whether
# its namespace is labelled cronlock.io/enabled=true.
Version = tuple[str, bool]


class Readings:
    """A bounded, thread-safe LRU of readings: per (uid, settings), the latest version read;
    and the namespaces labelled `cronlock.io/enabled: "true"`, which a reading depends on.

    An entry is used only for the same resourceVersion and namespace label: on the API
    server a uid and a resourceVersion name one content, and every edit gets a new version.
    The operator's runtime owns one and hands it to every reader, as it hands its caches,
    and tells it the labelled namespaces from its namespace watch; `cronlock status` and
    `cronlock lint` build one of the namespaces they can see. Every reader takes one (no
    default), so none can forget the labelled namespaces, and this module keeps no state
    of its own."""

    def __init__(self, limit: int = READINGS_KEPT, labelled: Iterable[str] = ()) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, Defaults], tuple[Version, ConfigReading]] = (
            OrderedDict()
        )
        self._labelled = frozenset(labelled)

    def labelled(self, namespace: str) -> bool:
        """Whether the namespace opted its CronJobs in by its label."""
        return namespace in self._labelled

    def set_labelled(self, namespace: str, labelled: bool) -> bool:
        """Record the namespace's label; whether that changed anything."""
        with self._lock:
            if (namespace in self._labelled) == labelled:
                return False
            change = frozenset([namespace])
            self._labelled = self._labelled | change if labelled else self._labelled - change
            return True

    def labelled_namespaces(self) -> frozenset[str]:
        return self._labelled

    def get(self, key: tuple[str, Defaults], version: Version) -> ConfigReading | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] != version:
                return None
            self._entries.move_to_end(key)
            return entry[1]

    def put(
        self, key: tuple[str, Defaults], version: Version, reading: ConfigReading
    ) -> ConfigReading:
        """The reading now kept for `key`: one another thread kept meanwhile for the same
        version (so that every reader of a version gets the same value), else `reading`."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] == version:
                self._entries.move_to_end(key)
                return entry[1]
            self._entries[key] = (version, reading)
            self._entries.move_to_end(key)
            while len(self._entries) > self.limit:
                self._entries.popitem(last=False)
            return reading

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


def read_config(
    cronjob: Mapping[str, Any], settings: Defaults, readings: Readings
) -> ConfigReading:
    """The CronJob's `ConfigReading` under `settings`, the one every reader uses.

    Kept in `readings` per CronJob (uid, resourceVersion, settings; the latest version of
    each of `READINGS_KEPT` CronJobs), so each version is parsed once and every reader of
    it sees the same value; a body without a uid or resourceVersion (a manifest's, a
    test's) is parsed each time, still under the namespace label `readings` knows.
    `readings` is required: a reader without it would know no labelled namespace and read
    a CronJob opted in by its namespace as off. Errors other than InvalidConfig propagate
    and nothing is kept.
    """
    metadata: Mapping[str, Any] = cronjob.get("metadata") or {}
    uid, version = metadata.get("uid"), metadata.get("resourceVersion")
    labelled = readings.labelled(str(metadata.get("namespace", "")))
    if not uid or not version:
        return _read(cronjob, settings, labelled)
    key = (str(uid), settings)
    reading = readings.get(key, (str(version), labelled))
    if reading is None:
        reading = readings.put(key, (str(version), labelled), _read(cronjob, settings, labelled))
    return reading


def counting_settings(
    cronjob: Mapping[str, Any], settings: Defaults, readings: Readings
) -> tuple[int, bool]:
    """`alert-after` and `keep-skipped-jobs` as the run accounting applies them: those of
    `read_config` (whose docstring says the rule)."""
    reading = read_config(cronjob, settings, readings)
    return reading.alert_after, reading.keep_skipped_jobs


def _read(cronjob: Mapping[str, Any], settings: Defaults, labelled: bool) -> ConfigReading:
    annotations = annotations_of(cronjob)
    config: LockConfig | None = None
    invalid: InvalidConfig | None = None
    enabled = False
    rule: OptIn | Literal["invalid"] = "invalid"
    try:
        rule = read_opt_in(cronjob, labelled)
        enabled = rule in GUARDING
        if enabled:
            config = parse_config(cronjob, settings)
    except InvalidConfig as error:
        # Kept in a long-lived memo: nothing that holds the parse's frames (and the body).
        invalid = error.with_traceback(None)
        invalid.__context__ = None
    if config is not None:
        return ConfigReading(
            enabled=True,
            config=config,
            invalid=None,
            alert_after=config.alert_after,
            keep_skipped_jobs=config.keep_skipped_jobs,
            alert_after_missed=config.alert_after_missed,
            lock=config.lock,
            policy=config.policy,
            opt_in=rule,
        )
    try:
        alert_after = parse_alert_after(annotations)
    except InvalidConfig:
        alert_after = contract.DEFAULT_ALERT_AFTER
    try:
        keep = parse_flag(annotations, contract.ANNOTATION_KEEP_SKIPPED_JOBS, default=False)
    except InvalidConfig:
        keep = False
    try:
        missed = parse_alert_after_missed(annotations, settings.default_alert_after_missed)
    except InvalidConfig:
        missed = settings.default_alert_after_missed
    metadata: Mapping[str, Any] = cronjob.get("metadata") or {}
    policy = annotations.get(contract.ANNOTATION_POLICY) or settings.default_policy
    return ConfigReading(
        enabled=enabled,
        config=None,
        invalid=invalid,
        alert_after=alert_after,
        keep_skipped_jobs=keep,
        alert_after_missed=missed,
        lock=annotations.get(contract.ANNOTATION_LOCK) or str(metadata.get("name", "")),
        policy=cast(Policy, policy) if policy in contract.POLICIES else "invalid",
        opt_in=rule,
    )
