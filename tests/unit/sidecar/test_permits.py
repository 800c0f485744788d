"""Permits in the lock's one document (lock/permits.py): read, claimed, renewed, released
and cleared per permit, permit 0 being the Lease's spec."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cronlock_sidecar.contract import ANNOTATION_PERMITS
from cronlock_sidecar.lock import permits
from cronlock_sidecar.lock.model import Timing, is_expired, read_lease
from cronlock_sidecar.lock.ticks import TickRecord, read_record, read_success
from tests.support.cronjobs import apply_json_patch
from tests.support.leases import MOMENT, make_lease

TIMING = Timing.of(30)
LATER = MOMENT + timedelta(seconds=10)


def lock(count: int, **kwargs: Any) -> dict[str, Any]:
    annotations = {"cronlock.io/permits": str(count), **kwargs.pop("annotations", {})}
    return make_lease(annotations=annotations, **kwargs)


def tick(holder: str, run: str = "uid-1") -> TickRecord:
    return TickRecord("report", MOMENT.replace(second=0), "report-29400000", run, holder, "")


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("1", 1),
        ("2", 2),
        (" 16 ", 16),
        ("17", None),
        ("0", None),
        ("-1", None),
        ("02", None),
        ("2.0", None),
        ("", None),
        ("many", None),
        (None, None),
        ("1000", None),
    ],
)
def test_a_permits_value_is_1_to_16(text: object, count: int | None) -> None:
    assert permits.read_count(text) == count


def test_a_lock_without_permits_is_one_permit_the_leases_spec() -> None:
    lease = make_lease("pod-a_1234abcd", job="report-1", duration=30)
    (only,) = permits.read_permits(lease)
    assert only.number == 0
    assert only.holder == "pod-a_1234abcd"
    assert only.holder_job == "report-1"
    assert only.transitions == 1
    assert only.expires_at == MOMENT + timedelta(seconds=30)


def test_a_hostile_permits_value_on_the_document_reads_as_one() -> None:
    for value in ("0", "99", "x", "-3"):
        assert len(permits.read_permits(lock(1, annotations={"cronlock.io/permits": value}))) == 1


def test_each_permit_is_claimed_on_its_own_and_its_token_counts_on_from_its_own() -> None:
    lease = lock(3)
    first = permits.claimed_permit(lease, 0, "pod-a_1", TIMING, MOMENT, "report-1")
    second = permits.claimed_permit(first, 2, "pod-b_2", TIMING, MOMENT, "report-2")
    read = permits.read_permits(second)
    assert [permit.holder for permit in read] == ["pod-a_1", "", "pod-b_2"]
    assert [permit.transitions for permit in read] == [1, 0, 1]
    assert read[2].holder_job == "report-2"
    assert read[2].duration_seconds == 30
    assert second["metadata"]["annotations"]["cronlock.io/permit.2"] == (
        "pod-b_2 2026-11-29T08:00:00.000000Z 2026-11-29T08:00:00.000000Z 30 1 report-2"
    )
    # Permit 0's spec and its Job are untouched by a claim of permit 2.
    assert read_lease(second).holder == "pod-a_1"
    assert read_lease(second).holder_job == "report-1"


def test_a_claim_writes_its_tick_record_in_the_same_write() -> None:
    claim = permits.claimed_permit(lock(2), 1, "pod-b_2", TIMING, MOMENT, "j", tick("pod-b_2"))
    record = read_record(claim["metadata"]["annotations"], "report")
    assert record is not None
    assert record.holder == "pod-b_2"


def test_a_released_permit_keeps_its_token_and_the_next_claim_counts_on() -> None:
    lease = permits.claimed_permit(lock(2), 1, "pod-b_2", TIMING, MOMENT, "report-2")
    lease = permits.renewed_permit(lease, 1, TIMING, LATER)
    assert permits.read_permits(lease)[1].renew_time == LATER
    gone = permits.released_permit(lease, 1, "pod-b_2", LATER, success=tick("pod-b_2"))
    entry = permits.read_permits(gone)[1]
    assert (entry.holder, entry.holder_job, entry.transitions) == ("", "", 1)
    annotations = gone["metadata"]["annotations"]
    assert annotations["cronlock.io/last-holder"] == "pod-b_2"
    assert read_success(annotations, "report") is not None
    again = permits.claimed_permit(gone, 1, "pod-c_3", TIMING, LATER, "report-3")
    assert permits.read_permits(again)[1].transitions == 2


@given(st.text(max_size=80))
def test_any_entry_text_reads_as_a_permit_and_never_raises(text: str) -> None:
    entry = permits.read_entry(1, text)
    assert entry.number == 1
    assert entry.transitions >= 0
    if len(text.split(" ")) != 6:
        assert entry.holder == ""


def test_an_entry_round_trips_through_its_text() -> None:
    entry = permits.Permit(3, "pod_1", MOMENT, LATER, 30, 7, "report-9")
    assert permits.read_entry(3, entry.text()) == entry


def test_each_permit_expires_by_the_one_rule() -> None:
    lease = permits.claimed_permit(lock(2), 1, "pod-b_2", TIMING, MOMENT, "")
    entry = permits.read_permits(lease)[1]
    assert not is_expired(entry, MOMENT + timedelta(seconds=32), 2)
    assert is_expired(entry, MOMENT + timedelta(seconds=32.001), 2)
    assert not is_expired(entry, MOMENT + timedelta(seconds=5), 2, believed_at_most=4)
    assert is_expired(entry, MOMENT + timedelta(seconds=7), 2, believed_at_most=4)
    assert not is_expired(permits.read_permits(lock(2))[1], MOMENT, 0)


def test_held_by_finds_the_one_permit_of_an_identity() -> None:
    lease = permits.claimed_permit(lock(3), 2, "pod-b_2", TIMING, MOMENT, "")
    found = permits.held_by(permits.read_permits(lease), "pod-b_2")
    assert found is not None
    assert found.number == 2
    assert permits.held_by(permits.read_permits(lease), "pod-x_9") is None


def test_the_operators_clear_applies_only_to_the_version_and_holder_it_read() -> None:
    lease = permits.claimed_permit(lock(2), 1, "pod-b_2", TIMING, MOMENT, "j")
    lease["metadata"]["resourceVersion"] = "7"
    patch = permits.cleared_permit(lease, 1, "pod-b_2", LATER)
    cleared = apply_json_patch(lease, patch)
    assert permits.read_permits(cleared)[1].holder == ""
    assert permits.read_permits(cleared)[1].transitions == 1
    # A renewal in between changes the entry: the test operation no longer matches.
    moved = permits.renewed_permit(lease, 1, TIMING, LATER)
    with pytest.raises(Exception, match="test"):
        apply_json_patch(moved, patch[1:])
    with pytest.raises(ValueError, match="not held by pod-x"):
        permits.cleared_permit(lease, 1, "pod-x", LATER)
    zero = permits.cleared_permit(make_lease("pod-a_1", resource_version="3"), 0, "pod-a_1", LATER)
    assert (
        read_lease(apply_json_patch(make_lease("pod-a_1", resource_version="3"), zero)).holder == ""
    )


@pytest.mark.parametrize("index", [0, 16, -1])
def test_permit_0_has_no_annotation_and_none_past_the_bound(index: int) -> None:
    with pytest.raises(ValueError, match="spec or does not exist"):
        permits.permit_key(index)


@pytest.mark.parametrize("said", [" 2", "2 ", "2\n", "02", "+2", "17"])
def test_a_documents_n_is_digits_alone_as_the_stores_rules_read_it(said: str) -> None:
    """A person's annotation may carry spaces (`read_count`); a lock's document may not:
    the stores' rules read N by this grammar, so a reader never sees another N."""
    body = make_lease(annotations={ANNOTATION_PERMITS: said})
    assert permits.permits_of(body) == 1
    assert permits.document_count(said) is None


def test_an_entry_with_a_field_ending_in_a_newline_holds_nothing() -> None:
    entry = permits.read_entry(1, "pod-a 2026-12-06T12:00:00.000000Z - 30 1 job\n")
    assert entry.holder == ""
