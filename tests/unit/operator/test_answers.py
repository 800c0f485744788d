"""How the operator reads the API server's refusals: which ones a retry cannot change."""

from __future__ import annotations

import json

import kubernetes

from cronlock_operator.kube.answers import policy_denial


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
