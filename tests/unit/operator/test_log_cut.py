"""A huge value a CronJob author wrote is cut the same way in its Event and in the
operator's log, and the Event still says what is wrong (security review N14)."""

from __future__ import annotations

import logging
from typing import Any
from unittest import mock

import kubernetes
import pytest

from cronlock_operator.cronjob import invalid
from cronlock_operator.cronjob.reading import Readings
from cronlock_operator.kube.writes import Kube
from cronlock_operator.reconcile.actions import PostEvent
from cronlock_operator.reconcile.cronjobs import CronJobInput, decide
from cronlock_operator.settings import OperatorSettings
from tests.support import gen

HUGE = 200 * 1024


def posting_kube(posted: list[dict[str, Any]]) -> Kube:
    """A Kube whose API server takes every Event (recorded in `posted`)."""
    kube = Kube(kubernetes.client.ApiClient(kubernetes.client.Configuration()))

    def create(namespace: str, body: dict[str, Any], **kwargs: Any) -> Any:
        posted.append(body)
        return mock.Mock()

    kube.core.create_namespaced_event = create  # type: ignore[method-assign]
    return kube


REPORT = (gen.in_namespace("reports"), gen.with_uid("u-1"))


def logged_messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name.startswith("cronlock")]


def test_a_200_kib_lock_is_cut_in_its_event_and_its_log_and_the_reason_stays(
    caplog: pytest.LogCaptureFixture,
) -> None:
    body = gen.cronjob("report", *REPORT, gen.annotated({"cronlock.io/lock": "x" * HUGE}))
    decision = decide(
        CronJobInput(body),
        OperatorSettings(sidecar_image="img"),
        readings=Readings(),
    )
    [warning] = [action for action in decision.before if isinstance(action, PostEvent)]
    posted: list[dict[str, Any]] = []
    with caplog.at_level(logging.INFO):
        posting_kube(posted).post_event(
            warning.involved, warning.reason, warning.message, warning.warning
        )

    [event] = posted
    [line] = logged_messages(caplog)
    assert len(event["message"]) <= invalid.MESSAGE_LIMIT
    assert line == f"InvalidConfig reports/report: {event['message']}"
    # Cut where the value is, so that the user still reads why it is refused.
    assert "is not a lock name" in event["message"]
    assert f"cut from {HUGE + 2} characters" in event["message"]  # json quotes the value
    # What the operator remembers to post only once is the cut message, not 200 KiB.
    assert all(len(message or "") <= invalid.MESSAGE_LIMIT for message in decision.posted.values())


def test_any_event_message_is_logged_cut_as_it_is_posted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    posted: list[dict[str, Any]] = []
    huge = "cronlock could not reconcile this CronJob (" + "y" * HUGE + ")"
    with caplog.at_level(logging.INFO):
        posting_kube(posted).post_event(
            gen.cronjob("report", *REPORT), "ReconcileError", huge, warning=True
        )

    [event] = posted
    [line] = logged_messages(caplog)
    assert len(event["message"]) <= invalid.MESSAGE_LIMIT
    assert event["message"].startswith("cronlock could not reconcile this CronJob (yyy")
    assert f"cut from {len(huge)} characters" in event["message"]
    assert line == f"ReconcileError reports/report: {event['message']}"
