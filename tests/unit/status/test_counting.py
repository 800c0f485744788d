"""`cronlock status` and the operator read one CronJob's counting settings alike.

The review found them apart: with `keep-skipped-jobs: "true"` and an unrelated invalid
annotation the operator deleted the skipped Jobs, and the two disagreed on the skip count
at which `RepeatedSkips` fires. Both now take `read_config`'s one reading.
"""

from __future__ import annotations

from typing import Any

import pytest

from cronlock_operator.cronjob.reading import Readings
from cronlock_operator.reconcile import cronjobs, runs
from cronlock_operator.reconcile.actions import DeleteJob, PostEvent
from cronlock_operator.status.model import rows
from tests.support import gen
from tests.support.cronjobs import SETTINGS
from tests.unit.status.objects import NOW

NAMESPACE = "team-a"


def counted(annotations: dict[str, str], *, skips: int = 0, stored: bool = True) -> Any:
    """The CronJob after `skips` skips in a row; `stored`: with a resourceVersion, as the
    API server sends it (read through the memo), else without (parsed each time)."""
    annotations = {"cronlock.io/enabled": "true", **annotations}
    if skips:
        annotations["cronlock.io/consecutive-skips"] = str(skips)
    as_sent = [gen.as_stored()] if stored else []
    return gen.cronjob("report", gen.annotated(annotations), gen.with_uid("uid-report"), *as_sent)


def skipped_job(name: str = "report-1") -> dict[str, Any]:
    return gen.job(
        name,
        gen.created_at("2026-12-01T00:00:01Z"),
        gen.of_lock("report"),
        gen.skipped(NAMESPACE),
    )


def reasons(actions: list[Any]) -> list[str]:
    return [action.reason for action in actions if isinstance(action, PostEvent)]


def operator_alerts_at(annotations: dict[str, str], skips: int, stored: bool) -> bool:
    """Whether the runs decider raises RepeatedSkips for the skip that makes it `skips`."""
    body = counted(annotations, skips=skips - 1, stored=stored)
    [run] = runs.decide(body, [skipped_job()], SETTINGS, readings=Readings()).runs
    return "RepeatedSkips" in reasons(run.actions)


def status_alerts_at(annotations: dict[str, str], skips: int, stored: bool) -> bool:
    """Whether `cronlock status` names the CronJob for `skips` skips in a row."""
    [row] = rows([counted(annotations, skips=skips, stored=stored)], [], NOW, readings=Readings())
    return any("consecutive runs" in problem for problem in row.problems)


KEEP_AND_INVALID = {"cronlock.io/keep-skipped-jobs": "true", "cronlock.io/ttl": "nonsense"}


@pytest.mark.parametrize("stored", [True, False])
def test_keep_skipped_jobs_holds_next_to_an_unrelated_invalid_annotation(stored: bool) -> None:
    body = counted(KEEP_AND_INVALID, stored=stored)
    [run] = runs.decide(body, [skipped_job()], SETTINGS, readings=Readings()).runs
    assert reasons(run.actions) == ["Skipped"]
    assert DeleteJob(NAMESPACE, "report-1") not in run.actions

    # The CronJob is refused alike by the operator and by status, for the same reason.
    decision = cronjobs.decide(
        cronjobs.CronJobInput(body),
        SETTINGS,
        readings=Readings(),
    )
    assert decision.keep_guard
    assert cronjobs.pending_guard(body, SETTINGS, Readings()) is None
    refused = decision.posted["InvalidConfig"]
    assert refused is not None
    assert refused.startswith('cronlock.io/ttl: "nonsense" is not a duration')
    [row] = rows([body], [], NOW, readings=Readings())
    [problem] = row.problems
    assert refused.removesuffix(cronjobs.LEFT_AS_IT_WAS) in problem

    # Without keep-skipped-jobs the same skip deletes its Job.
    plain = counted({"cronlock.io/ttl": "nonsense"}, stored=stored)
    [run] = runs.decide(plain, [skipped_job()], SETTINGS, readings=Readings()).runs
    assert DeleteJob(NAMESPACE, "report-1") in run.actions


@pytest.mark.parametrize("stored", [True, False])
@pytest.mark.parametrize(
    ("annotations", "alert_after"),
    [
        (KEEP_AND_INVALID, 3),
        ({**KEEP_AND_INVALID, "cronlock.io/alert-after": "2"}, 2),
        ({**KEEP_AND_INVALID, "cronlock.io/alert-after": "zero"}, 3),  # bad itself: default
        ({"cronlock.io/keep-skipped-jobs": "true", "cronlock.io/alert-after": "4"}, 4),
        ({"cronlock.io/policy": "replce", "cronlock.io/alert-after": "1"}, 1),
    ],
)
def test_status_and_the_operator_agree_on_when_repeated_skips_fires(
    annotations: dict[str, str], alert_after: int, stored: bool
) -> None:
    operator = [operator_alerts_at(annotations, skips, stored) for skips in range(1, 7)]
    status = [status_alerts_at(annotations, skips, stored) for skips in range(1, 7)]
    assert operator == status
    assert operator.index(True) + 1 == alert_after
    [row] = rows([counted(annotations, stored=stored)], [], NOW, readings=Readings())
    assert row.alert_after == alert_after
