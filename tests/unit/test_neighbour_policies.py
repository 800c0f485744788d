"""The neighbours the e2e and integration tests put beside cronlock (tests/support/neighbours.py)
each act in the test's own namespace only: a policy bound cluster-wide would change every
other test's pods."""

from __future__ import annotations

from tests.support import neighbours


def test_each_policy_has_its_binding_and_it_selects_one_namespace() -> None:
    documents = [
        *neighbours.defaults("team-a"),
        *neighbours.injector("team-a"),
        *neighbours.arbitrary_uids("team-a", 1000650000),
    ]
    policies = {d["metadata"]["name"] for d in documents if d["kind"] == "MutatingAdmissionPolicy"}
    bindings = [d for d in documents if d["kind"] == "MutatingAdmissionPolicyBinding"]
    assert len(policies) == 4
    assert {binding["spec"]["policyName"] for binding in bindings} == policies
    for binding in bindings:
        selector = binding["spec"]["matchResources"]["namespaceSelector"]
        assert selector == {"matchLabels": {"kubernetes.io/metadata.name": "team-a"}}
