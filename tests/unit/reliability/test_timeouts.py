"""The checker's own tests give their trials their own limits before pytest's."""

from __future__ import annotations

import re

from tests.support.paths import ROOT


def test_every_reliability_test_gives_its_trials_their_own_limits_first() -> None:
    """A pytest timeout shorter than the checker's trials at their own limit cuts the
    checker off before it reports a slow trial (timed_out_trials): a slow but correct run
    would read as a hang. Each checker test's mark is derived from its trials."""
    for path in ("tests/integration/test_reliability.py", "tests/e2e/test_reliability_pods.py"):
        text = (ROOT / path).read_text()
        marks = re.findall(r"@pytest\.mark\.timeout\(([^)]*\)?)\)", text)
        assert marks, path
        for mark in marks:
            assert not mark.strip().isdigit(), f"{path}: timeout({mark}) is not derived"
