"""The tests' in-memory API server keeps to the calls the real adapter offers."""

from __future__ import annotations

import inspect

import pytest

from cronlock_operator.kube.calls import HolderRbacCalls, KubeCalls
from cronlock_operator.kube.rbac_writes import HolderRbac
from cronlock_operator.kube.writes import Kube
from tests.support.fakekube import FakeHolderRbac, FakeKube


def members(protocol: type) -> list[str]:
    return sorted(
        name for name in vars(protocol) if not name.startswith("_") and name not in ("holder_rbac",)
    )


def test_the_fakes_are_what_the_runtime_is_typed_against() -> None:
    assert isinstance(FakeKube(), KubeCalls)
    assert isinstance(FakeHolderRbac(), HolderRbacCalls)
    assert "create_lease" in members(KubeCalls)
    assert "labelled" in members(HolderRbacCalls)


@pytest.mark.parametrize(
    ("real", "fake", "protocol"),
    [(Kube, FakeKube, KubeCalls), (HolderRbac, FakeHolderRbac, HolderRbacCalls)],
)
def test_each_call_takes_the_same_parameters_as_the_real_one(
    real: type, fake: type, protocol: type
) -> None:
    for name in members(protocol):
        expected = list(inspect.signature(getattr(real, name)).parameters)
        assert list(inspect.signature(getattr(fake, name)).parameters) == expected, name
        assert list(inspect.signature(getattr(protocol, name)).parameters) == expected, name
