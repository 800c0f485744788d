"""Posting an Event: a namespace being deleted is given up at once, a hiccup is retried."""

from __future__ import annotations

from typing import Any

import kubernetes
import pytest

from cronlock_operator.kube import Kube
from cronlock_operator.workqueue import Retry

CRONJOB = {"metadata": {"name": "report", "namespace": "reports", "uid": "u-1"}}
TERMINATING = (
    '{"kind":"Status","message":"events \\"report.1\\" is forbidden: unable to create new '
    'content in namespace reports because it is being terminated","reason":"Forbidden",'
    '"code":403}'
)


def kube_answering(error: kubernetes.client.ApiException) -> Kube:
    kube = Kube(kubernetes.client.ApiClient(kubernetes.client.Configuration()))

    def create(namespace: str, body: Any, **kwargs: Any) -> Any:
        raise error

    kube.core.create_namespaced_event = create  # type: ignore[method-assign]
    return kube


@pytest.mark.parametrize("status", [403, 404])
def test_an_event_in_a_namespace_being_deleted_is_not_retried(status: int) -> None:
    error = kubernetes.client.ApiException(status=status, reason="Forbidden")
    error.body = TERMINATING if status == 403 else '{"code":404}'
    kube_answering(error).post_event(CRONJOB, "Injected", "lock report")


def test_any_other_refusal_of_an_event_is_retried() -> None:
    error = kubernetes.client.ApiException(status=403, reason="Forbidden")
    error.body = '{"message":"events is forbidden: User cannot create resource"}'
    with pytest.raises(Retry):
        kube_answering(error).post_event(CRONJOB, "Injected", "lock report")
