"""How the operator reads the API server's answers: which refusals a retry cannot change,
which it can, and a 404 as the project's own Gone."""

from __future__ import annotations

import json

import kubernetes
import pytest

from cronlock_operator.kube.answers import policy_denial, transient_errors
from cronlock_operator.kube.errors import Gone, Retry


def refusal(status: int, message: str) -> kubernetes.client.ApiException:
    error = kubernetes.client.ApiException(status=status, reason="Forbidden")
    error.body = json.dumps({"kind": "Status", "message": message, "code": status})
    return error


def test_a_policy_denial_is_permanent_and_says_why() -> None:
    said = (
        'cronjobs.batch "report" is forbidden: ValidatingAdmissionPolicy '
        "'cronlock-operator-scope' with binding 'cronlock-operator-scope' denied request: "
        "cronlock's containers (cronlock, cronlock-gate) run only the configured sidecar image"
    )
    assert policy_denial(refusal(403, said)) == said


def test_rbac_refusals_and_other_answers_are_not_policy_denials() -> None:
    rbac = 'cronjobs.batch "report" is forbidden: User "x" cannot patch resource "cronjobs"'
    assert policy_denial(refusal(403, rbac)) == ""
    assert policy_denial(refusal(409, "ValidatingAdmissionPolicy")) == ""
    garbled = kubernetes.client.ApiException(status=403, reason="Forbidden")
    garbled.body = "<html>"
    assert policy_denial(garbled) == ""


@pytest.mark.parametrize(
    ("status", "becomes"), [(404, Gone), (409, Retry), (503, Retry), (403, Retry), (400, None)]
)
def test_past_the_edge_no_answer_is_a_client_exception_but_the_unforeseen(
    status: int, becomes: type[Exception] | None
) -> None:
    expected = becomes or kubernetes.client.ApiException
    with pytest.raises(expected) as raised, transient_errors("patch cronjob team-a/report"):
        raise kubernetes.client.ApiException(status=status, reason="Because")
    if becomes is not None:
        assert "patch cronjob team-a/report" in str(raised.value)
