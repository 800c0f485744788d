"""The operator's lock defaults a CronJob's annotations are read under, and their check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol

from cronlock_operator.cronjob.invalid import InvalidConfig
from cronlock_operator.cronjob.policies import Policy
from cronlock_operator.cronjob.timing import (
    check_renew,
    check_ttl,
    default_renew_seconds,
    format_seconds,
    kill_grace_seconds,
)
from cronlock_sidecar import contract

# cronlock.io/alert-after-missed: 0 turns NotSucceeding off for the CronJob.
MAX_ALERT_AFTER_MISSED: Final = 1000


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
    if defaults.default_policy not in contract.DEFAULT_POLICIES:
        raise ValueError(
            f"default policy {defaults.default_policy!r} is not one of "
            + ", ".join(contract.DEFAULT_POLICIES)
            + " (queue is set per CronJob, with cronlock.io/policy)"
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
        ttl = check_ttl(
            float(defaults.default_ttl_seconds), format_seconds(defaults.default_ttl_seconds)
        )
        renew = defaults.default_renew_seconds
        if renew is None:
            renew = default_renew_seconds(ttl)
        check_renew(ttl, renew, format_seconds(renew), defaults.skew_seconds)
        kill_grace_seconds(ttl, defaults.skew_seconds, format_seconds(ttl))
    except InvalidConfig as error:
        raise ValueError(f"operator default: {error}") from error
