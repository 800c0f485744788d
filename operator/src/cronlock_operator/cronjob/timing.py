"""How long a lock's runs may take to notice a lost lease and stop: the `/held` probe, the
kill grace and the bounds of the TTL and the renewal they leave."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from cronlock_operator.cronjob.invalid import InvalidConfig
from cronlock_sidecar import contract
from cronlock_sidecar.lock.model import Timing, TimingError, default_renew_ms, seconds_text

MIN_TTL_SECONDS: Final = 5
MAX_TTL_SECONDS: Final = 24 * 3600
# A renewal more often than once a second only loads the API server.
MIN_RENEW_SECONDS: Final = 1.0
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


def check_ttl(seconds: float, text: str) -> int:
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


def check_renew(ttl: int, renew: float, text: str, skew_seconds: int) -> None:
    annotation = contract.ANNOTATION_RENEW
    if renew >= ttl:
        raise InvalidConfig(
            annotation, text, f"must be shorter than the ttl ({format_seconds(ttl)})"
        )
    if renew < MIN_RENEW_SECONDS:
        raise InvalidConfig(
            annotation, text, "is too short; renew at most once a second (expected at least 1s)"
        )
    try:
        Timing.of(ttl, renew, skew_seconds).check()
    except TimingError as error:
        raise InvalidConfig(annotation, text, error.reason) from None


def format_seconds(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole}s" if whole == seconds else f"{seconds:g}s"
