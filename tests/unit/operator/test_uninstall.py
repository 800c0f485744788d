"""`cronlock-operator --uninstall` as the upgrade hook runs it: only the CronJobs, only
where it was told (the API side is tests/integration/test_uninstall.py)."""

from __future__ import annotations

import logging
from typing import Any

import jsonpatch  # type: ignore[import-untyped]  # a dependency of the kubernetes client
import pytest

from cronlock_operator.cache import ObjectCache
from cronlock_operator.injection.build import build_injection, is_injected
from cronlock_operator.kube.writes import Kube
from cronlock_operator.lock.config import parse_config
from cronlock_operator.uninstall import uninstall
from cronlock_sidecar import contract
from tests.support.cronjobs import SETTINGS, make_cronjob

ORIGINAL_GRACE = contract.ANNOTATION_ORIGINAL_TERMINATION_GRACE_PERIOD_SECONDS


class FakeKube(Kube):
    """CronJobs in a dict; anything else it is asked for fails the test."""

    def __init__(self, cronjobs: list[dict[str, Any]]) -> None:
        self.stored = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in cronjobs}
        self.patched: list[tuple[str, str]] = []

    def list_cronjobs(self, namespaces: Any, into: ObjectCache) -> None:
        for (namespace, _), body in self.stored.items():
            if not namespaces or namespace in namespaces:
                into.put(body)

    def patch_cronjob(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> Any:
        self.patched.append((namespace, name))
        key = (namespace, name)
        self.stored[key] = jsonpatch.apply_patch(self.stored[key], patch)
        return self.stored[key]

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"uninstall used {name}")


def injected_in(namespace: str) -> dict[str, Any]:
    cronjob = make_cronjob(namespace=namespace)
    cronjob["metadata"]["resourceVersion"] = "1"
    return build_injection(cronjob, parse_config(cronjob, SETTINGS), SETTINGS)


def test_revert_only_reverts_the_cronjobs_outside_the_kept_namespaces_and_deletes_nothing() -> None:
    kube = FakeKube([injected_in("kept"), injected_in("dropped-a"), injected_in("dropped-b")])

    code = uninstall(kube, [], keep=["kept"], revert_only=True, sleep=lambda _s: None)

    assert code == 0
    assert sorted(kube.patched) == [("dropped-a", "report"), ("dropped-b", "report")]
    assert is_injected(kube.stored[("kept", "report")])
    assert not is_injected(kube.stored[("dropped-a", "report")])
    # A second pass found nothing more to do; no Lease or Role was asked for (__getattr__).


def test_named_namespaces_only() -> None:
    kube = FakeKube([injected_in("kept"), injected_in("dropped-a")])

    assert uninstall(kube, ["dropped-a"], revert_only=True, sleep=lambda _s: None) == 0
    assert kube.patched == [("dropped-a", "report")]


def test_a_cronjob_whose_record_cannot_be_read_back_stops_no_other_and_fails_the_hook(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A CronJob-only editor writes an odd `original-*` value on her injected CronJob: the
    hook still reverts every other one, names hers, and exits 1 (security review N6)."""
    odd = injected_in("alice")
    odd["metadata"]["annotations"][ORIGINAL_GRACE] = "x"
    kube = FakeKube([odd, injected_in("billing")])

    with caplog.at_level(logging.ERROR):
        code = uninstall(kube, [], revert_only=True, settle=0, sleep=lambda _s: None)

    assert code == 1
    assert kube.patched == [("billing", "report")]
    assert not is_injected(kube.stored[("billing", "report")])
    assert is_injected(kube.stored[("alice", "report")])
    assert "alice/report left injected, revert it by hand" in caplog.text
