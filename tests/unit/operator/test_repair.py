"""The operator puts a free Lease's out-of-range fields back (security review M2)."""

from __future__ import annotations

from typing import Any

from cronlock_operator.reconcile import repair
from cronlock_operator.reconcile.actions import PatchLease, PostEvent
from cronlock_sidecar import contract
from tests.support import gen
from tests.support.leases import make_lease

OWNER = gen.cronjob("report", gen.in_namespace("default"))
JOBS = contract.ANNOTATION_REPLACED_JOBS
JOBS_PATH = "/metadata/annotations/cronlock.io~1replaced-jobs"


def poisoned(holder: str = "", transitions: int = 3, **annotations: str) -> dict[str, Any]:
    return make_lease(
        holder, transitions=transitions, annotations=annotations, resource_version="41"
    )


def test_a_lease_in_range_needs_nothing() -> None:
    assert repair.decide(poisoned(), [OWNER]) == []
    at_ceiling = poisoned(transitions=repair.TRANSITIONS_CEILING)
    assert repair.decide(at_ceiling, [OWNER]) == []
    yielded = poisoned(**{contract.ANNOTATION_REPLACED_BY: "b_1", JOBS: "report-1,report-0"})
    assert repair.decide(yielded, [OWNER]) == []


def test_transitions_no_claim_could_add_one_to_start_again_with_a_warning() -> None:
    for transitions in (2147483647, -5):
        actions = repair.decide(poisoned(transitions=transitions), [OWNER])
        patch, event = actions
        assert isinstance(patch, PatchLease)
        assert patch.patch == [
            {"op": "test", "path": "/metadata/resourceVersion", "value": "41"},
            {"op": "replace", "path": "/spec/leaseTransitions", "value": 0},
        ]
        assert isinstance(event, PostEvent)
        assert (event.reason, event.warning) == ("LeaseRepaired", True)
        assert f"leaseTransitions {transitions}" in event.message
        assert "fencing tokens start again from 1" in event.message


def test_a_replaced_jobs_list_no_yield_wrote_is_removed_or_cut_to_the_kept_length() -> None:
    names = ",".join(f"report-{index}" for index in range(contract.REPLACED_JOBS_KEPT + 5))
    [unwritten, _] = repair.decide(poisoned(**{JOBS: names}), [OWNER])
    assert isinstance(unwritten, PatchLease)
    assert unwritten.patch[1:] == [{"op": "remove", "path": JOBS_PATH}]
    long = poisoned(**{contract.ANNOTATION_REPLACED_BY: "b_1", JOBS: names})
    [cut, event] = repair.decide(long, [OWNER])
    assert isinstance(cut, PatchLease)
    kept = ",".join(names.split(",")[: contract.REPLACED_JOBS_KEPT])
    assert cut.patch[1:] == [{"op": "replace", "path": JOBS_PATH, "value": kept}]
    assert isinstance(event, PostEvent)
    assert f"lists {contract.REPLACED_JOBS_KEPT + 5} Jobs" in event.message


def test_a_held_lease_is_left_to_its_holder() -> None:
    """A claim by the holder already succeeded; the repair waits for the Lease to be free."""
    assert repair.decide(poisoned("a_12345678", transitions=2147483647), [OWNER]) == []
