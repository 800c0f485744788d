"""`cronlock.io/jitter`: its parsing and bound, its injection into the sidecar and the gate,
and the warning (an Event, and `cronlock lint`'s) when it is not shorter than the schedule's
shortest gap."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cronlock_operator.cronjob.config import InvalidConfig, parse_config
from cronlock_operator.cronjob.schedule import jitter_not_shorter_than_gap_warning
from cronlock_operator.injection.build import build_injection
from cronlock_operator.status import cli
from tests.support import gen
from tests.support.cronjobs import SETTINGS
from tests.unit.operator.test_injection import env_of, pod_spec


def jittered(value: str, *modifiers: gen.Modifier) -> dict[str, object]:
    return gen.cronjob("report", gen.annotated({"cronlock.io/jitter": value}), *modifiers)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("0", 0), ("0s", 0), ("30s", 30), ("1m30s", 90), ("250ms", 0.25), ("1h", 3600)],
)
def test_a_jitter_from_none_to_an_hour_is_read(value: str, seconds: float) -> None:
    assert parse_config(jittered(value), SETTINGS).jitter_seconds == seconds


def test_no_jitter_annotation_is_none() -> None:
    assert parse_config(gen.cronjob("report", gen.annotated({})), SETTINGS).jitter_seconds == 0


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("61m", "is out of range; expected a duration from 0 (no jitter) to 1h"),
        ("1000000h", "is out of range"),
        ("-1s", "is not a duration; expected a Go duration"),
        ("soon", "is not a duration"),
        ("x" * 5000, "is not a duration"),
    ],
)
def test_a_hostile_jitter_is_refused_with_an_actionable_reason(value: str, reason: str) -> None:
    with pytest.raises(InvalidConfig) as refused:
        parse_config(jittered(value), SETTINGS)
    assert refused.value.annotation == "cronlock.io/jitter"
    assert reason in refused.value.reason
    assert len(str(refused.value)) < 600  # a 5,000-character value is quoted cut


def sidecar_and_gate_env(value: str | None) -> tuple[dict[str, object], dict[str, object]]:
    user = gen.cronjob(
        "report", gen.annotated({} if value is None else {"cronlock.io/jitter": value})
    )
    injected = build_injection(user, parse_config(user, SETTINGS), SETTINGS)
    sidecar, gate = pod_spec(injected)["initContainers"][:2]
    return env_of(sidecar), env_of(gate)


def test_the_jitter_goes_to_the_sidecar_and_the_gate_and_nothing_without_one() -> None:
    sidecar, gate = sidecar_and_gate_env("45s")
    assert sidecar["CRONLOCK_JITTER"] == gate["CRONLOCK_JITTER"] == "45s"
    for none in (None, "0"):
        sidecar, gate = sidecar_and_gate_env(none)
        assert "CRONLOCK_JITTER" not in sidecar
        assert "CRONLOCK_JITTER" not in gate
    # A fraction of a second, in whole milliseconds (the sidecar reads it back exactly).
    assert sidecar_and_gate_env("20m0.5s")[0]["CRONLOCK_JITTER"] == "1200500ms"
    assert sidecar_and_gate_env("1.0004s")[0]["CRONLOCK_JITTER"] == "1s"


def test_a_jitter_not_shorter_than_the_shortest_gap_is_warned_of() -> None:
    five = parse_config(jittered("5m"), SETTINGS)
    warning = jitter_not_shorter_than_gap_warning(five, "*/5 * * * *")
    assert warning == (
        "jitter 5m is not shorter than the shortest gap between two runs of the schedule "
        "'*/5 * * * *' (5m): a run could start after the next tick's, and the two overlap or "
        "skip; consider a cronlock.io/jitter shorter than the gap"
    )
    assert jitter_not_shorter_than_gap_warning(five, "*/10 * * * *") is None
    assert jitter_not_shorter_than_gap_warning(five, "garbage") is None
    shorter = parse_config(jittered("4m59s"), SETTINGS)
    assert jitter_not_shorter_than_gap_warning(shorter, "*/5 * * * *") is None
    none = parse_config(jittered("0"), SETTINGS)
    assert jitter_not_shorter_than_gap_warning(none, "* * * * *") is None


def test_lint_warns_on_the_jitters_line_and_errs_on_a_bad_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "report.yaml"
    path.write_text(
        yaml.safe_dump_all(
            [
                gen.cronjob(
                    "report",
                    gen.with_annotations(
                        {"cronlock.io/enabled": "true", "cronlock.io/jitter": "1h"}
                    ),
                    gen.with_schedule("*/30 * * * *"),
                ),
                gen.cronjob(
                    "billing",
                    gen.with_annotations(
                        {"cronlock.io/enabled": "true", "cronlock.io/jitter": "2h"}
                    ),
                ),
            ],
            sort_keys=False,
        )
    )
    rows = path.read_text().splitlines()
    lines = [n for n, row in enumerate(rows, 1) if row.lstrip().startswith("cronlock.io/jitter")]
    assert cli.main(["lint", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"{path}:{lines[0]}: warning: CronJob team-a/report: jitter 1h is not shorter than the "
        "shortest gap between two runs of the schedule '*/30 * * * *' (30m): a run could start "
        "after the next tick's, and the two overlap or skip; consider a cronlock.io/jitter "
        "shorter than the gap",
        f'{path}:{lines[1]}: error: CronJob team-a/billing: cronlock.io/jitter: "2h" is out of '
        "range; expected a duration from 0 (no jitter) to 1h, the longest a run's pod may wait "
        "before it takes its lock",
    ]
