"""The code's contract module says what users were promised (tests/support/contract.py)."""

from __future__ import annotations

from cronlock_sidecar import contract as code
from tests.support import contract as promised


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
