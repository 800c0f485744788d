"""The code's contract module says what users were promised (tests/support/contract.py)."""

from __future__ import annotations

from cronlock_sidecar import contract as code
from tests.support import contract as promised
from tests.support.paths import ROOT


def test_exit_codes_are_the_published_ones() -> None:
    assert (
        code.EXIT_OK,
        code.EXIT_SKIPPED,
        code.EXIT_UNAVAILABLE,
        code.EXIT_SOFTWARE_LOST,
        code.EXIT_CONFIG,
    ) == (
        promised.EXIT_OK,
        promised.EXIT_SKIPPED,
        promised.EXIT_UNAVAILABLE,
        promised.EXIT_LOST,
        promised.EXIT_CONFIG,
    )


def test_container_and_object_names_are_the_published_ones() -> None:
    assert code.SIDECAR_CONTAINER == promised.SIDECAR_CONTAINER
    assert code.GATE_CONTAINER == promised.GATE_CONTAINER
    assert code.lease_name("report") == promised.LEASE_PREFIX + "report"
    assert code.HOLDER_ROLE + "-" == promised.HOLDER_ROLE_PREFIX
    assert (code.LABEL_MANAGED_BY, code.MANAGED_BY) == promised.MANAGED_BY
    assert code.LABEL_LOCK == promised.LOCK_LABEL
    assert (code.LABEL_OUTCOME, code.LABELLED_OUTCOMES) == promised.OUTCOME_LABEL


def test_the_freeze_policy_guards_exactly_the_freeze_annotations() -> None:
    policy = (ROOT / "charts" / "cronlock" / "templates" / "freeze.yaml").read_text()
    listed = policy.split("- name: notes", 1)[1].split("- name:", 1)[0]
    import re

    assert tuple(re.findall(r'"(cronlock\.io/[a-z-]+)"', listed)) == code.FREEZE_NOTES


def test_the_operator_policy_admits_exactly_the_outcome_labels_the_operator_writes() -> None:
    policy = (ROOT / "charts" / "cronlock" / "templates" / "_scope-policy.tpl").read_text()
    label, values = promised.OUTCOME_LABEL
    assert f'key == "{label}" ?' in policy
    assert f"variables.newLabels[key] in {list(values)}".replace("'", '"') in policy


def test_the_holder_identity_is_the_one_the_holders_policy_builds() -> None:
    """The chart's CEL builds `<pod>_<uid[:8]>` from a pod-bound token's claims; the sidecar
    holds as `contract.holder_identity`. A change to either must change both."""
    assert code.holder_identity("report-29001-x7k2p", "3f2a9c1e-0000-4000-8000-000000000000") == (
        "report-29001-x7k2p_3f2a9c1e"
    )
    assert code.identity_pod("report-29001-x7k2p_3f2a9c1e") == "report-29001-x7k2p"
    policy = (ROOT / "charts" / "cronlock" / "templates" / "admission-policy.yaml").read_text()
    me = policy.split("- name: me", 1)[1].split("- name:", 1)[0]
    assert 'variables.pod + "_" +' in me
    assert f".substring(0, {code.IDENTITY_UID_CHARS})" in me
    assert '"authentication.kubernetes.io/pod-uid"' in me
