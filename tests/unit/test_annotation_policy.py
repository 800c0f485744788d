"""The chart's annotation policy is `cronlock lint`'s rules rendered, never edited apart
(its verdicts against lint's: tests/integration/test_annotation_policy.py)."""

from __future__ import annotations

from cronlock_operator.lint import admission
from cronlock_sidecar import contract
from tests.support.paths import ROOT


def test_the_chart_template_is_the_generators_output() -> None:
    checked_in = (ROOT / admission.TEMPLATE).read_text()
    assert checked_in == admission.render(), (
        f"{admission.TEMPLATE} is stale: run `python -m cronlock_operator.lint.admission`"
    )


def test_every_user_annotation_has_a_rule() -> None:
    judged = {rule.annotation for rule in admission.rules()}
    assert judged >= contract.USER_SETTINGS


def test_every_rule_names_the_annotation_and_starts_with_cronlocks_prefix() -> None:
    template = admission.render()
    for rule in admission.rules():
        assert f'"{admission.MESSAGE_PREFIX} " + {rule.message}' in template
        assert rule.annotation == "(any)" or rule.annotation in rule.message
