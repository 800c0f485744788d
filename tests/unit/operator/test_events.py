"""Posting Events: a namespace being deleted is given up at once, a hiccup is retried, and
the poster threads keep each object's Events in order."""

from __future__ import annotations

import logging
import threading
from typing import Any

import kubernetes
import pytest

from cronlock_operator.kube.errors import Retry
from cronlock_operator.kube.writes import Kube
from cronlock_operator.runtime import events
from cronlock_operator.runtime.events import EventPoster
from tests.support import gen
from tests.support.fakekube import FakeKube

CRONJOB = {"metadata": {"name": "report", "namespace": "reports", "uid": "u-1"}}
TERMINATING = (
    '{"kind":"Status","message":"events \\"report.1\\" is forbidden: unable to create new '
    'content in namespace reports because it is being terminated","reason":"Forbidden",'
    '"code":403}'
)


def kube_answering(
    error: kubernetes.client.ApiException, calls: list[tuple[str, Any]] | None = None
) -> Kube:
    """A Kube whose every Event create is refused with `error`; each try lands in `calls`."""
    kube = Kube(kubernetes.client.ApiClient(kubernetes.client.Configuration()))

    def create(namespace: str, body: Any, **kwargs: Any) -> Any:
        if calls is not None:
            calls.append((namespace, body))
        raise error

    kube.core.create_namespaced_event = create  # type: ignore[method-assign]
    return kube


@pytest.mark.parametrize("status", [403, 404])
def test_an_event_in_a_namespace_being_deleted_is_not_retried(
    status: int, caplog: pytest.LogCaptureFixture
) -> None:
    error = kubernetes.client.ApiException(status=status, reason="Forbidden")
    error.body = TERMINATING if status == 403 else '{"code":404}'
    calls: list[tuple[str, Any]] = []
    with caplog.at_level(logging.DEBUG, logger="cronlock_operator"):
        kube_answering(error, calls).post_event(CRONJOB, "Injected", "lock report")
    # Tried once, in the CronJob's namespace, then given up: no Retry raised, none posted.
    assert [(namespace, body["reason"]) for namespace, body in calls] == [("reports", "Injected")]
    given_up = [r.getMessage() for r in caplog.records if "being deleted" in r.getMessage()]
    assert given_up == ["post event Injected on reports/report: its namespace is being deleted"]
    assert not [r for r in caplog.records if r.levelno >= logging.INFO], caplog.text


def test_any_other_refusal_of_an_event_is_retried() -> None:
    error = kubernetes.client.ApiException(status=403, reason="Forbidden")
    error.body = '{"message":"events is forbidden: User cannot create resource"}'
    with pytest.raises(Retry):
        kube_answering(error).post_event(CRONJOB, "Injected", "lock report")


class RecordingKube(FakeKube):
    """Records which thread posted each Event; the first `failures` tries for `flaky` hiccup."""

    def __init__(self, flaky: str = "", failures: int = 0) -> None:
        super().__init__()
        self.posted: list[tuple[str, str, str]] = []
        self.lock = threading.Lock()
        left = [failures]

        def hiccup(involved: Any, *rest: Any) -> BaseException | None:
            with self.lock:
                if involved["metadata"]["name"] != flaky or left[0] == 0:
                    return None
                left[0] -= 1
                return Retry("the API server hiccuped")

        self.fail["post_event"] = hiccup

    def post_event(self, involved: Any, reason: str, message: str, warning: bool = False) -> None:
        super().post_event(involved, reason, message, warning)
        with self.lock:
            self.posted.append(
                (involved["metadata"]["name"], reason, threading.current_thread().name)
            )


def test_each_cronjobs_events_are_posted_in_order_by_one_thread_and_all_threads_work() -> None:
    kube = RecordingKube()
    poster = EventPoster(kube, posters=2)
    names = [f"job-{index}" for index in range(40)]
    for step in ("Skipped", "RepeatedSkips", "Injected"):
        for name in names:
            poster.post(
                gen.cronjob(name, gen.in_namespace("reports"), gen.with_uid(f"u-{name}")),
                step,
                f"{step} {name}",
            )
    poster.stop(timeout=10)

    assert len(kube.posted) == 3 * len(names)
    for name in names:
        mine = [(reason, thread) for posted, reason, thread in kube.posted if posted == name]
        assert [reason for reason, _ in mine] == ["Skipped", "RepeatedSkips", "Injected"]
        assert len({thread for _, thread in mine}) == 1
    assert {thread for _, _, thread in kube.posted} == {"cronlock-events-0", "cronlock-events-1"}


def test_a_hiccup_is_retried_in_place_so_the_order_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "FIRST_DELAY", 0.01)
    kube = RecordingKube(flaky="report", failures=2)
    poster = EventPoster(kube, posters=2)
    poster.post(
        gen.cronjob("report", gen.in_namespace("reports"), gen.with_uid("u-report")),
        "Skipped",
        "first",
    )
    poster.post(
        gen.cronjob("report", gen.in_namespace("reports"), gen.with_uid("u-report")),
        "RepeatedSkips",
        "second",
    )
    poster.stop(timeout=10)
    assert [reason for _, reason, _ in kube.posted] == ["Skipped", "RepeatedSkips"]
