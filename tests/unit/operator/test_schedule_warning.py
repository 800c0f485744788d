"""The warning when a lock's TTL outlasts the shortest gap between two of its CronJob's ticks."""

from __future__ import annotations

from cronlock_operator.cronjob.config import parse_config
from cronlock_operator.cronjob.schedule import ttl_longer_than_gap_warning
from tests.support import gen
from tests.support.cronjobs import SETTINGS


def test_warning_when_ttl_outlasts_the_gap() -> None:
    config = parse_config(
        gen.cronjob("report", gen.annotated({"cronlock.io/ttl": "10m"})),
        SETTINGS,
    )
    warning = ttl_longer_than_gap_warning(config, "*/5 * * * *")
    assert warning is not None
    assert "10m" in warning
    assert "5m" in warning
    assert "more than one" in warning
    assert ttl_longer_than_gap_warning(config, "*/10 * * * *") is None
    assert ttl_longer_than_gap_warning(config, "@hourly") is None
    assert ttl_longer_than_gap_warning(config, "garbage") is None
