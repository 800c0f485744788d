"""What `cronlock status` makes of CronJobs and Leases: lock states, skips and the exit code."""

from __future__ import annotations

from datetime import timedelta

import pytest

from cronlock_operator.cronjob.config import parse_config
from cronlock_operator.cronjob.defaults import LockDefaults
from cronlock_operator.cronjob.reading import Readings
from cronlock_operator.injection.build import desired_cronjob
from cronlock_operator.settings import OperatorSettings
from cronlock_operator.status.model import exit_code, human_duration, rows
from cronlock_operator.status.render import expires_text, holder_text, renewed_text
from tests.unit.status.objects import NOW, cronjob, lease


def test_a_fresh_holder_shows_when_it_renewed_and_when_it_expires() -> None:
    [row] = rows(
        [cronjob("report", last_schedule_ago=65)],
        [lease("report", holder="report-29-abcde_1f2e", renewed_ago=4, duration=30)],
        NOW,
        readings=Readings(),
    )

    assert (row.namespace, row.cronjob, row.lock, row.lease) == (
        "default",
        "report",
        "report",
        "cronlock-report",
    )
    assert row.state == "held"
    assert holder_text(row) == "report-29-abcde_1f2e"
    assert renewed_text(row) == "4s ago"
    assert expires_text(row) == "in 26s"
    assert row.expires_in_seconds == pytest.approx(26)
    assert row.last_schedule_seconds_ago == pytest.approx(65)
    assert row.problems == ()
    assert exit_code([row]) == 0


def test_a_free_lease_has_no_holder_and_no_expiry_but_remembers_the_last_holder() -> None:
    [row] = rows(
        [cronjob("report")],
        [
            lease(
                "report",
                holder="",
                renewed_ago=300,
                annotations={
                    "cronlock.io/last-holder": "report-28-zzzzz_0a0b",
                    "cronlock.io/released-at": "2026-11-29T07:55:00.000001Z",
                },
            )
        ],
        NOW,
        readings=Readings(),
    )

    assert row.state == "free"
    assert row.holder is None
    assert holder_text(row) == "-"
    assert expires_text(row) == "-"
    assert row.expires_in_seconds is None
    assert row.last_holder == "report-28-zzzzz_0a0b"
    assert row.released_at == NOW - timedelta(minutes=5) + timedelta(microseconds=1)
    assert exit_code([row]) == 0


def test_a_holder_that_stopped_renewing_long_ago_is_expired_and_fails_the_check() -> None:
    [row] = rows(
        [cronjob("report")],
        [lease("report", holder="report-27-dead_9999", renewed_ago=3600 + 42, duration=60)],
        NOW,
        readings=Readings(),
    )

    assert row.state == "expired"
    assert holder_text(row) == "report-27-dead_9999"
    assert expires_text(row) == "expired 59m ago"
    assert row.expires_in_seconds == pytest.approx(-3582)
    assert row.problems == (
        "lease default/cronlock-report expired 59m ago but is still held by report-27-dead_9999",
    )
    assert exit_code([row]) == 1


def test_within_the_clock_skew_allowance_a_late_holder_still_counts_as_holding() -> None:
    [row] = rows(
        [cronjob("report")],
        [lease("report", holder="report-29-abcde_1f2e", renewed_ago=31, duration=30)],
        NOW,
        readings=Readings(),
    )

    assert row.state == "held"
    assert expires_text(row) == "expired 1s ago"
    assert exit_code([row]) == 0


def test_a_missing_lease_shows_as_missing_without_failing_the_check() -> None:
    [row] = rows([cronjob("report")], [], NOW, readings=Readings())

    assert row.state == "missing"
    assert holder_text(row) == "missing"
    assert renewed_text(row) == "-"
    assert expires_text(row) == "-"
    assert exit_code([row]) == 0


def test_only_cronjobs_annotated_enabled_true_are_listed_sorted_by_namespace_and_name() -> None:
    cronjobs = [
        cronjob("zeta", "b"),
        cronjob("alpha", "b"),
        cronjob("beta", "a"),
        cronjob("off", "a", enabled="false"),
        cronjob("plain", "a", enabled=None),
    ]

    listed = [(row.namespace, row.cronjob) for row in rows(cronjobs, [], NOW, readings=Readings())]

    assert listed == [("a", "beta"), ("b", "alpha"), ("b", "zeta")]


def test_the_lock_annotation_names_the_lease_and_only_the_same_namespace_counts() -> None:
    cronjobs = [
        cronjob("export", "team-a", lock="shared"),
        cronjob("import", "team-a", lock="shared"),
    ]
    leases = [
        lease("shared", "team-b", holder="elsewhere_1", renewed_ago=1),
        lease("shared", "team-a", holder="export-1-aaaaa_0001", renewed_ago=1),
    ]

    found = rows(cronjobs, leases, NOW, readings=Readings())

    assert [(row.cronjob, row.lease, row.holder) for row in found] == [
        ("export", "cronlock-shared", "export-1-aaaaa_0001"),
        ("import", "cronlock-shared", "export-1-aaaaa_0001"),
    ]


@pytest.mark.parametrize(
    ("skips", "alert_after", "failing"),
    [
        (None, None, False),
        (2, None, False),
        (3, None, True),
        (4, "5", False),
        (5, "5", True),
        (1, "1", True),
    ],
)
def test_consecutive_skips_fail_the_check_from_alert_after_on(
    skips: int | None, alert_after: str | None, failing: bool
) -> None:
    [row] = rows(
        [cronjob("report", skips=skips, alert_after=alert_after)], [], NOW, readings=Readings()
    )

    assert row.consecutive_skips == (skips or 0)
    assert exit_code([row]) == (1 if failing else 0)
    if failing:
        assert row.problems == (
            f"cronjob default/report skipped {skips} consecutive runs "
            f"(alert-after {row.alert_after})",
        )


@pytest.mark.parametrize("alert_after", ["not-a-number", "0", "1" + "0" * 5000])
def test_a_bad_alert_after_is_named_as_the_operator_names_it_and_the_default_applies(
    alert_after: str,
) -> None:
    [row] = rows(
        [cronjob("report", skips=2, alert_after=alert_after)], [], NOW, readings=Readings()
    )

    assert row.alert_after == 3
    assert exit_code([row]) == 1
    [problem] = row.problems
    assert problem.startswith("cronjob default/report: cronlock.io/alert-after: ")
    assert "is not a number of skips; expected a whole number from 1 to 1000" in problem


def test_a_garbled_skip_counter_reads_as_zero() -> None:
    broken = cronjob("report")
    broken["metadata"]["annotations"]["cronlock.io/consecutive-skips"] = "many"

    [row] = rows([broken], [], NOW, readings=Readings())

    assert row.consecutive_skips == 0


def test_one_expired_lock_among_healthy_ones_is_enough_to_fail() -> None:
    found = rows(
        [cronjob("a"), cronjob("b"), cronjob("c")],
        [
            lease("a", holder="a-1_1", renewed_ago=1),
            lease("b", holder="b-1_1", renewed_ago=500),
            lease("c"),
        ],
        NOW,
        readings=Readings(),
    )

    assert [row.state for row in found] == ["held", "expired", "free"]
    assert exit_code(found) == 1
    assert exit_code([]) == 0


def test_a_lease_renewed_by_a_clock_ahead_of_ours_does_not_show_negative_ages() -> None:
    [row] = rows(
        [cronjob("report")],
        [lease("report", holder="x_1", renewed_ago=-3)],
        NOW,
        readings=Readings(),
    )

    assert renewed_text(row) == "0s ago"
    assert expires_text(row) == "in 33s"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (4.4, "4s"),
        (119, "119s"),
        (120, "2m"),
        (192, "3m12s"),
        (47 * 60 + 5, "47m"),
        (5 * 3600 + 3 * 60, "5h3m"),
        (30 * 3600, "30h"),
        (2 * 86400 + 4 * 3600, "2d4h"),
        (400 * 86400, "400d"),
        (3 * 365 * 86400 + 86400, "3y1d"),
    ],
)
def test_ages_read_like_kubectl(seconds: float, text: str) -> None:
    assert human_duration(seconds) == text


def test_a_cronjob_the_operator_refuses_is_named_with_the_operators_reason() -> None:
    broken = cronjob("report")
    broken["metadata"]["annotations"]["cronlock.io/ttl"] = "soon"

    [row] = rows([broken], [], NOW, readings=Readings())

    assert exit_code([row]) == 1
    [problem] = row.problems
    assert problem.startswith('cronjob default/report: cronlock.io/ttl: "soon" is not a duration')
    assert "InvalidConfig Event" in problem


@pytest.mark.parametrize(
    ("annotated", "shown"),
    [(None, "skip"), ("replace", "replace"), ("observe", "observe"), ("replce", "invalid")],
)
def test_the_policy_is_shown_as_the_operator_reads_it(annotated: str | None, shown: str) -> None:
    guarded = cronjob("report")
    if annotated is not None:
        guarded["metadata"]["annotations"]["cronlock.io/policy"] = annotated
    [row] = rows([guarded], [lease("report", holder="")], NOW, readings=Readings())
    assert row.policy == shown
    assert bool(row.problems) == (shown == "invalid")


@pytest.mark.parametrize(
    ("annotated", "shown"), [(None, "wait"), ("skip", "skip")], ids=["default", "annotated"]
)
def test_the_policy_is_read_under_the_defaults_the_operators_injection_shows(
    annotated: str | None, shown: str
) -> None:
    """An operator run with --default-policy wait and --default-ttl 2m: status, which
    cannot see its flags, reads them from what it injected, not from the chart's defaults."""
    operator = OperatorSettings(
        sidecar_image="ghcr.io/example/cronlock:1.0.0",
        lock=LockDefaults(default_policy="wait", default_ttl_seconds=120),
    )
    written = cronjob("report")
    if annotated is not None:
        written["metadata"]["annotations"]["cronlock.io/policy"] = annotated
    injected = desired_cronjob(written, parse_config(written, operator), operator)
    plain = cronjob("export")
    [export, report] = rows(
        [injected, plain], [lease("report", holder="")], NOW, readings=Readings()
    )
    assert (report.cronjob, report.policy, report.problems) == ("report", shown, ())
    assert (export.cronjob, export.policy) == ("export", "skip")  # nothing injected: the chart's


def test_an_injection_whose_values_do_not_read_leaves_the_charts_defaults() -> None:
    operator = OperatorSettings(
        sidecar_image="ghcr.io/example/cronlock:1.0.0", lock=LockDefaults(default_policy="wait")
    )
    written = cronjob("report")
    injected = desired_cronjob(written, parse_config(written, operator), operator)
    [sidecar] = injected["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"][:1]
    for item in sidecar["env"]:
        if item["name"] == "CRONLOCK_TTL":
            item["value"] = "soon"
    [row] = rows([injected], [lease("report", holder="")], NOW, readings=Readings())
    assert row.policy == "skip"
