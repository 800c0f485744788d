"""`cronlock freeze` on a lock whose Lease only registers its users (security review L-N5)."""

from __future__ import annotations

from typing import Any

from cronlock_operator.freeze.commands import registry_refusal
from cronlock_operator.leases.ownership import new_lease, store_marks
from tests.support import gen


def lease(store: str, secret: str | None = None) -> dict[str, Any]:
    cronjob = gen.cronjob("nightly")
    cronjob["metadata"]["uid"] = "u-nightly"
    return new_lease("cronlock-nightly", cronjob, "nightly", 60, store_marks(store, secret))


def test_a_store_locks_registry_lease_is_refused_naming_the_secret_its_cronjobs_use() -> None:
    for store in ("redis", "postgres"):
        for verb in ("freeze", "unfreeze"):
            refusal = registry_refusal(lease(store, "team-locks"), "team", "nightly", verb)
            assert refusal == (
                f"lock nightly in team is kept in {store}, and its runs read a freeze only "
                f"there, not on its Lease: {verb} it with --store-secret team-locks (the "
                "Secret its CronJobs name in cronlock.io/store-secret)"
            )


def test_a_lease_lock_and_an_unmarked_lease_are_frozen_on_the_lease() -> None:
    assert registry_refusal(lease("lease"), "team", "nightly", "freeze") is None
    assert "annotations" not in lease("lease")["metadata"]
    assert registry_refusal({"metadata": {}}, "team", "nightly", "freeze") is None
