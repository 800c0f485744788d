"""tests/support/timing.py: bounds from the timing model, and timings too short to tell
the paths apart refused before a test relies on them."""

from __future__ import annotations

import types

import pytest

from cronlock_operator.cronjob.timing import PROBE_TOLERANCES, ProbeTolerance
from cronlock_operator.injection.containers import held_probe
from cronlock_sidecar.lock.model import Timing
from tests.support.timing import (
    SLACK,
    at_deadline,
    at_next_renewal,
    at_once,
    at_renew_deadline,
    earliest_renew_deadline,
    liveness_verdict,
)


def test_the_renew_deadline_window_runs_from_two_renewals_before_it_to_the_ttl() -> None:
    bound = at_renew_deadline(Timing.of(6, 1), "the run is stopped")
    assert (bound.low, bound.high) == (2.0, 6.0)
    assert bound.check(4.0) == 4.0


@pytest.mark.parametrize(
    ("ttl", "renew", "why"),
    [
        (3, 0.5, "the path is expected within 2s"),  # the review's flake: 1s to the ttl
        (6, 1.5, "too close to the next renewal"),
    ],
)
def test_a_timing_without_room_for_the_slack_is_refused(ttl: float, renew: float, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        at_renew_deadline(Timing.of(ttl, renew), "the run is stopped")


def test_at_once_is_the_slack_and_must_stay_clear_of_the_alternative() -> None:
    bound = at_once("SIGTERM", "released", instead_of=6, alternative="expiry")
    assert (bound.low, bound.high) == (0.0, SLACK)
    with pytest.raises(ValueError, match="lengthen the timing"):
        at_once("SIGTERM", "released", instead_of=SLACK - 0.5, alternative="expiry")


def test_the_next_renewal_is_told_apart_from_the_renew_deadline() -> None:
    timing = Timing.of(6, 0.5)
    bound = at_next_renewal(timing, "the takeover", "the loss is seen")
    assert bound.high == earliest_renew_deadline(timing) == 3.5
    with pytest.raises(ValueError, match=r"reaches the alternative at 1\.7s"):
        at_next_renewal(Timing.of(3, 0.3), "the takeover", "the loss is seen")


def test_a_miss_names_the_window_and_the_path() -> None:
    bound = at_deadline(1.0, "the deadline was set", "the watchdog SIGTERMs CMD")
    with pytest.raises(
        AssertionError, match=r"0\.90s after the deadline was set, outside \[1s, 3s\)"
    ):
        bound.check(0.9)
    with pytest.raises(AssertionError, match="expected when the watchdog SIGTERMs CMD"):
        bound.check(3.0)


@pytest.mark.parametrize("tolerance", PROBE_TOLERANCES, ids=str)
def test_a_probes_verdict_is_the_operators_detection_time_and_the_slack(
    tolerance: ProbeTolerance,
) -> None:
    # The probe as the operator injects it, read back from the pod spec by the e2e tests.
    probe = held_probe(types.SimpleNamespace(probe=tolerance, kill_grace_seconds=2))  # type: ignore[arg-type]
    assert liveness_verdict(probe) == tolerance.detection_ms / 1000 + SLACK


def test_a_probe_without_settings_has_the_kubelets_defaults() -> None:
    # periodSeconds 10, timeoutSeconds 1, failureThreshold 3: 10 + 3 x 10.
    assert liveness_verdict({"httpGet": {"path": "/held", "port": 8484}}) == 40 + SLACK
