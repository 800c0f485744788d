"""`holds`, the window the integration ring checks "nothing happened" over: it fails at the
first violation, even one in its last moment, and is no bare sleep."""

from __future__ import annotations

import time

import pytest

from tests.support.kube import holds
from tests.support.timing import at_once


def test_a_condition_true_throughout_holds_for_the_whole_window() -> None:
    checks: list[float] = []

    def probe() -> bool:
        checks.append(time.monotonic())
        return True

    start = time.monotonic()
    holds(probe, 0.5, "steady", every=0.1)
    assert time.monotonic() - start >= 0.5
    assert len(checks) >= 5
    assert checks[-1] - start >= 0.5, "the window's end was not checked"


def test_the_first_violation_fails_at_once_naming_it() -> None:
    answers = iter([True, True, False])
    window = 5.0
    start = time.monotonic()
    with pytest.raises(AssertionError, match=r"the CronJob stays uninjected: no longer true"):
        holds(lambda: next(answers), window, "the CronJob stays uninjected", every=0.05)
    at_once(
        "the window opened",
        "holds failed at the third check",
        instead_of=window,
        alternative="the window's end",
    ).check(time.monotonic() - start)


def test_a_violation_at_the_last_moment_fails() -> None:
    deadline = time.monotonic() + 0.3
    with pytest.raises(AssertionError):
        holds(lambda: time.monotonic() < deadline, 0.3, "until the end", every=1.0)


def test_a_probe_may_assert_with_its_own_message() -> None:
    def probe() -> bool:
        raise AssertionError("2 ReconcileError Events: retried")

    with pytest.raises(AssertionError, match="2 ReconcileError Events"):
        holds(probe, 1, "one warning")
