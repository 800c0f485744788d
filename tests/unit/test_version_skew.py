"""The supported version skew (docs/UPGRADING.md): which releases work together, how an
injection records its operator's, and what the operator and the sidecar say outside it."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest

from cronlock_operator.cronjob.config import parse_config
from cronlock_operator.cronjob.reading import Readings
from cronlock_operator.injection.build import desired_cronjob
from cronlock_operator.injection.containers import injected_by
from cronlock_operator.reconcile import cronjobs
from cronlock_operator.reconcile.actions import PatchCronJob, PostEvent
from cronlock_sidecar import cli, contract
from tests.support import gen
from tests.support.cronjobs import SETTINGS

ANNOTATED = {"cronlock.io/enabled": "true"}


@pytest.mark.parametrize(
    ("version", "release"),
    [
        ("0.1.0", (0, 1)),
        ("1.12", (1, 12)),
        ("2.3.4-rc.1", (2, 3)),
        ("2.3.4+build.7", (2, 3)),
        ("v1.2.3", None),
        ("1", None),
        ("1.2.3.4", None),
        ("", None),
        ("1.x.0", None),
        ("9" * 7 + ".1", None),
        # Digits to str.isdigit() but not to int() (L-N7), or not ASCII: none is a version.
        ("\u00b2.1", None),
        ("0.\u00b2", None),
        ("\u0661.2", None),
        ("1.\uff12.0", None),
    ],
)
def test_a_release_is_major_and_minor_of_a_version(
    version: str, release: tuple[int, int] | None
) -> None:
    assert contract.release_of(version) == release


@pytest.mark.parametrize(
    ("sidecar", "operator", "supported"),
    [
        ("0.4.0", "0.4.9", True),
        ("0.3.2", "0.4.0", True),
        ("0.5.0-rc.1", "0.4.0", True),
        ("0.2.0", "0.4.0", False),
        ("0.6.0", "0.4.0", False),
        ("1.4.0", "0.4.0", False),
        ("garbage", "0.4.0", False),
    ],
)
def test_the_skew_is_one_minor_release_either_way_in_one_major(
    sidecar: str, operator: str, supported: bool
) -> None:
    assert contract.within_skew(sidecar, operator) is supported
    assert contract.within_skew(operator, sidecar) is supported


def injected() -> dict[str, Any]:
    body = gen.cronjob(
        "report", gen.with_annotations(ANNOTATED), gen.with_uid("uid-skew"), gen.as_stored()
    )
    return desired_cronjob(body, parse_config(body, SETTINGS), SETTINGS)


def stamped(version: str | None) -> dict[str, Any]:
    """An injected CronJob whose sidecar says the operator of `version` injected it (None:
    an injection from before the stamp, which carries no such variable)."""
    body = copy.deepcopy(injected())
    sidecar = body["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"][0]
    sidecar["env"] = [e for e in sidecar["env"] if e["name"] != contract.ENV_OPERATOR_VERSION]
    if version is not None:
        sidecar["env"].append({"name": contract.ENV_OPERATOR_VERSION, "value": version})
    return body


def decide(body: dict[str, Any], posted: dict[str, str] | None = None) -> Any:
    return cronjobs.decide(
        cronjobs.CronJobInput(body, posted=posted or {}),
        SETTINGS,
        readings=Readings(),
    )


def skew_events(decision: Any) -> list[PostEvent]:
    return [
        action
        for action in decision.after
        if isinstance(action, PostEvent) and action.reason == cronjobs.SKEW_REASON
    ]


def test_an_injection_records_the_release_of_the_operator_that_made_it() -> None:
    assert injected_by(injected()) == contract.VERSION
    assert (
        injected_by(
            gen.cronjob(
                "report", gen.with_annotations(ANNOTATED), gen.with_uid("uid-skew"), gen.as_stored()
            )
        )
        is None
    )
    assert injected_by(stamped(None)) == contract.UNSTAMPED_VERSION


def test_an_injection_inside_the_skew_is_replaced_without_a_warning() -> None:
    major, minor = contract.release_of(contract.VERSION) or (0, 0)
    older = f"{major}.{minor + 1}.0"
    decision = decide(stamped(older))
    assert skew_events(decision) == []
    assert decision.posted[cronjobs.SKEW_REASON] is None
    # Its injection is this release's now: one patch, which stamps this release.
    (patch,) = [action for action in decision.after if isinstance(action, PatchCronJob)]
    assert injected_by(decision.desired) == contract.VERSION
    assert patch.namespace == "team-a"


def test_an_injection_outside_the_skew_is_one_warning_then_replaced() -> None:
    major, minor = contract.release_of(contract.VERSION) or (0, 0)
    newer = f"{major}.{minor + 2}.0"
    first = decide(stamped(newer))
    (event,) = skew_events(first)
    assert event.warning
    assert repr(newer) in event.message
    assert "docs/UPGRADING.md" in event.message
    assert any(isinstance(action, PatchCronJob) for action in first.after)
    # Seen again before the patch lands: not posted twice.
    again = decide(stamped(newer), posted={cronjobs.SKEW_REASON: event.message})
    assert skew_events(again) == []
    # Another major release is outside it too, whatever its minor.
    assert skew_events(decide(stamped(f"{major + 1}.{minor}.0")))


def test_a_hostile_version_is_quoted_and_cut_in_the_warning() -> None:
    hostile = "9.9.9\n" + "x" * 500
    (event,) = skew_events(decide(stamped(hostile)))
    assert "\n" not in event.message
    assert len(event.message) < 600


def test_the_sidecar_warns_at_start_only_outside_the_skew(
    caplog: pytest.LogCaptureFixture,
) -> None:
    major, minor = contract.release_of(contract.VERSION) or (0, 0)
    with caplog.at_level(logging.WARNING, logger="cronlock_sidecar.version"):
        cli._warn_if_outside_skew({contract.ENV_OPERATOR_VERSION: contract.VERSION})
        cli._warn_if_outside_skew({})
        assert caplog.records == []
        cli._warn_if_outside_skew({contract.ENV_OPERATOR_VERSION: f"{major}.{minor + 2}.0"})
    (record,) = caplog.records
    assert "outside the supported skew" in record.getMessage()


@pytest.mark.parametrize("version", ["\u00b2.1", "0.\u00b2.0", "1.\u00b9"])
def test_a_version_int_cannot_read_is_one_warning_and_a_new_injection_not_a_crash(
    version: str,
) -> None:
    # A CronJob's editor may write any value into the injected sidecar's environment: one
    # that str.isdigit() accepts and int() refuses once failed every reconcile (L-N7).
    decision = decide(stamped(version))
    (event,) = skew_events(decision)
    assert repr(version) in event.message
    assert injected_by(decision.desired) == contract.VERSION
