"""`cronlock-operator --uninstall` as the upgrade hook runs it: only the CronJobs, only
where it was told (the API side is tests/integration/test_uninstall.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from cronlock_operator.cronjob.config import parse_config
from cronlock_operator.injection.build import build_injection, is_injected
from cronlock_operator.uninstall import uninstall
from cronlock_sidecar import contract
from tests.support import gen
from tests.support.cronjobs import SETTINGS
from tests.support.fakekube import FakeKube

ORIGINAL_GRACE = contract.ANNOTATION_ORIGINAL_TERMINATION_GRACE_PERIOD_SECONDS


class RevertingKube(FakeKube):
    """The in-memory API server; a revert-only pass may list and patch CronJobs, nothing else."""

    ALLOWED = frozenset({"list_cronjobs", "patch_cronjob", "post_event"})

    @property
    def patched(self) -> list[tuple[str, str]]:
        asked = {call for call, _ in self.calls}
        assert asked <= self.ALLOWED, f"uninstall used {sorted(asked - self.ALLOWED)}"
        return [(namespace, name) for namespace, name, _ in self.called("patch_cronjob")]


def injected_in(namespace: str) -> dict[str, Any]:
    cronjob = gen.cronjob("report", gen.in_namespace(namespace))
    cronjob["metadata"]["resourceVersion"] = "1"
    return build_injection(cronjob, parse_config(cronjob, SETTINGS), SETTINGS)


def test_revert_only_reverts_the_cronjobs_outside_the_kept_namespaces_and_deletes_nothing() -> None:
    kube = RevertingKube([injected_in("kept"), injected_in("dropped-a"), injected_in("dropped-b")])

    code = uninstall(kube, [], keep=["kept"], revert_only=True, sleep=lambda _s: None)

    assert code == 0
    assert sorted(kube.patched) == [("dropped-a", "report"), ("dropped-b", "report")]
    assert is_injected(kube.cronjobs[("kept", "report")])
    assert not is_injected(kube.cronjobs[("dropped-a", "report")])
    # A second pass found nothing more to do; no Lease or Role was asked for (`patched`).


def test_named_namespaces_only() -> None:
    kube = RevertingKube([injected_in("kept"), injected_in("dropped-a")])

    assert uninstall(kube, ["dropped-a"], revert_only=True, sleep=lambda _s: None) == 0
    assert kube.patched == [("dropped-a", "report")]


def test_a_cronjob_whose_record_cannot_be_read_back_stops_no_other_and_is_told(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A CronJob-only editor writes an odd `original-*` value on her injected CronJob: the
    hook still reverts every other one, names hers in the log and in a NotReverted Warning
    on it, and exits 0: her one CronJob fails no uninstall or upgrade (security review N6,
    L5)."""
    odd = injected_in("alice")
    odd["metadata"]["annotations"][ORIGINAL_GRACE] = "x"
    kube = RevertingKube([odd, injected_in("billing")])

    with caplog.at_level(logging.ERROR):
        code = uninstall(kube, [], revert_only=True, settle=0, sleep=lambda _s: None)

    assert code == 0
    assert kube.patched == [("billing", "report")]
    [(name, reason, message, warning)] = kube.events
    assert (name, reason, warning) == ("report", "NotReverted", True)
    assert "revert this CronJob" in message
    assert not is_injected(kube.cronjobs[("billing", "report")])
    assert is_injected(kube.cronjobs[("alice", "report")])
    assert "alice/report left injected, revert it by hand" in caplog.text
