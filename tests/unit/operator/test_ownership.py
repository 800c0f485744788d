"""Whose a Lease or Role is, and what cronlock writes about it: judged without an API server."""

from __future__ import annotations

from typing import Any

from cronlock_operator.leases.ownership import (
    DeleteLease,
    KeepOwners,
    joining,
    new_lease,
    without_owner,
)
from cronlock_operator.reconcile.rbac import (
    RbacWrite,
    holder_binding,
    holder_role,
    stale,
    write_for,
)
from tests.support.leases import make_lease

OURS = {"app.kubernetes.io/managed-by": "cronlock"}
REPORT = {"metadata": {"name": "report", "uid": "u-report", "namespace": "ns"}}


def owner(name: str, uid: str) -> dict[str, str]:
    return {"apiVersion": "batch/v1", "kind": "CronJob", "name": name, "uid": uid}


def lease(*owners: tuple[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    """Lock ledger's Lease in ns at version 41, used by `owners` (name, uid); `labels` as
    make_lease's."""
    return make_lease(
        lock="ledger", namespace="ns", owners=owners, labels=labels, resource_version="41"
    )


def test_a_new_lease_is_labelled_owned_and_unheld() -> None:
    assert new_lease("cronlock-ledger", REPORT, "ledger", 30) == {
        "metadata": {
            "name": "cronlock-ledger",
            "labels": {**OURS, "cronlock.io/lock": "ledger"},
            "ownerReferences": [owner("report", "u-report")],
        },
        "spec": {"leaseDurationSeconds": 30},
    }
    assert joining(REPORT, "ledger") == {
        "metadata": {
            "labels": {**OURS, "cronlock.io/lock": "ledger"},
            "ownerReferences": [owner("report", "u-report")],
        }
    }


def test_forgetting_an_owner_keeps_the_others_and_deletes_with_the_last() -> None:
    both = lease(("report", "u-report"), ("export", "u-export"))
    assert without_owner(both, "u-report") == KeepOwners(
        [
            {"op": "test", "path": "/metadata/resourceVersion", "value": "41"},
            {
                "op": "replace",
                "path": "/metadata/ownerReferences",
                "value": [owner("export", "u-export")],
            },
        ]
    )
    assert without_owner(lease(("report", "u-report")), "u-report") == DeleteLease("41")


def test_nothing_to_forget_on_a_gone_foreign_or_unowned_lease() -> None:
    assert without_owner(None, "u-report") is None
    assert without_owner(lease(("report", "u-report"), labels={}), "u-report") is None
    assert without_owner(lease(("export", "u-export")), "u-report") is None


def test_a_holder_role_is_created_left_replaced_or_left_alone_when_foreign() -> None:
    desired = holder_role("runner", ["cronlock-ledger"])
    assert write_for("Role", "ns", None, desired) == RbacWrite("create", desired)
    current = {**desired, "metadata": {**desired["metadata"], "resourceVersion": "7"}}
    assert write_for("Role", "ns", current, desired) == RbacWrite("same")
    widened = holder_role("runner", ["cronlock-ledger", "cronlock-report"])
    replaced = write_for("Role", "ns", current, widened)
    assert replaced.verdict == "replace"
    assert replaced.body is not None
    assert replaced.body["metadata"]["resourceVersion"] == "7"
    assert replaced.body["rules"] == widened["rules"]
    foreign = write_for("Role", "ns", {"metadata": {"name": "cronlock-holder-runner"}}, desired)
    assert foreign.verdict == "foreign"
    assert foreign.reason.startswith("Role ns/cronlock-holder-runner exists and was not made by")


def test_a_binding_compares_its_subjects_and_role_ref() -> None:
    desired = holder_binding("ns", "runner")
    moved = {**desired, "subjects": [{"kind": "ServiceAccount", "name": "x", "namespace": "ns"}]}
    moved["metadata"] = {**desired["metadata"], "resourceVersion": "3"}
    assert write_for("RoleBinding", "ns", moved, desired).verdict == "replace"


def test_only_labelled_holder_objects_no_guard_needs_are_stale() -> None:
    labelled = ["cronlock-holder-a", "cronlock-holder-b", "something-else"]
    assert stale(labelled, ["cronlock-holder-a"]) == ["cronlock-holder-b"]
