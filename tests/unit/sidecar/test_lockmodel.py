"""The lock model: one reading of a Lease, one expiry rule, one timing rule for everyone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cronlock_operator.cronjob.config import InvalidConfig, parse_config
from cronlock_operator.settings import OperatorSettings
from cronlock_sidecar.lock.model import (
    Timing,
    TimingError,
    cleared,
    holder_of,
    is_expired,
    read_lease,
    released,
    token_of,
    token_set,
    with_token,
)
from cronlock_sidecar.options import ConfigError, parse_options
from tests.support import gen
from tests.support.cronjobs import apply_json_patch

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def lease(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "cronlock-report",
            "namespace": "team-a",
            "resourceVersion": "42",
            "labels": {"app.kubernetes.io/managed-by": "cronlock", "cronlock.io/lock": "report"},
            "annotations": {
                "cronlock.io/holder-job": "report-1",
                "cronlock.io/last-holder": "report-0-abc_1234",
                "cronlock.io/released-at": "2026-12-01T11:00:00.000000Z",
            },
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "CronJob", "name": "report", "uid": "u1"}
            ],
        },
        "spec": spec,
    }


def stamp(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_a_lease_reads_as_one_record() -> None:
    record = read_lease(
        lease(
            holderIdentity="report-1-xyz_abcd1234",
            acquireTime=stamp(50),
            renewTime=stamp(10),
            leaseDurationSeconds=30,
            leaseTransitions=7,
        )
    )
    assert (record.namespace, record.name, record.lock, record.managed) == (
        "team-a",
        "cronlock-report",
        "report",
        True,
    )
    assert record.owner_uids == ("u1",)
    assert record.holder == "report-1-xyz_abcd1234"
    assert record.renewed_at == NOW - timedelta(seconds=10)
    assert record.expires_at == NOW + timedelta(seconds=20)
    assert record.renew_time_text == stamp(10)
    assert (record.transitions, record.holder_job) == (7, "report-1")
    assert record.last_holder == "report-0-abc_1234"
    assert record.released_at == datetime(2026, 12, 1, 11, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "spec",
    [
        {"holderIdentity": 5, "renewTime": "yesterday", "leaseDurationSeconds": "30"},
        {"holderIdentity": None, "leaseTransitions": True, "leaseDurationSeconds": 1.5},
        {},
    ],
)
def test_malformed_fields_read_as_unset(spec: dict[str, Any]) -> None:
    record = read_lease(lease(**spec))
    assert record.holder == ""
    assert record.renewed_at is None
    assert record.duration_seconds is None
    assert record.transitions == 0
    assert not is_expired(record, NOW, 2)  # nobody holds it


def test_a_body_that_is_not_a_lease_reads_as_an_empty_record() -> None:
    record = read_lease({"metadata": "nonsense", "spec": ["x"]})
    assert (record.name, record.holder, record.lock, record.managed) == ("", "", None, False)


@pytest.mark.parametrize(
    ("renewed_ago", "expired"),
    [(31.9, False), (32.0, False), (32.001, True), (100, True)],
)
def test_a_holder_expires_past_its_duration_plus_the_skew(
    renewed_ago: float, expired: bool
) -> None:
    record = read_lease(
        lease(holderIdentity="h", renewTime=stamp(renewed_ago), leaseDurationSeconds=30)
    )
    assert is_expired(record, NOW, 2) is expired


@pytest.mark.parametrize(
    ("renewed_ago", "believed", "expired"),
    [(7.9, 5, False), (8.001, 5, True), (8.001, None, False), (31.9, 60, False)],
    ids=["inside-cap", "past-cap", "no-cap", "cap-longer-than-written"],
)
def test_a_reader_believes_a_hold_at_most_for_its_own_duration(
    renewed_ago: float, believed: float | None, expired: bool
) -> None:
    """A day-long hold (or a 30s one) read by a store reader of ttl 5s, skew 3s: expired 8s
    after its renewal; a cap longer than the written duration changes nothing."""
    record = read_lease(
        lease(holderIdentity="h", renewTime=stamp(renewed_ago), leaseDurationSeconds=30)
    )
    assert is_expired(record, NOW, 3, believed_at_most=believed) is expired


def test_a_holder_with_no_readable_time_counts_as_expired() -> None:
    record = read_lease(lease(holderIdentity="h", renewTime="garbage", leaseDurationSeconds=30))
    assert is_expired(record, NOW, 2)


def test_the_acquire_time_stands_in_for_a_missing_renew_time() -> None:
    record = read_lease(lease(holderIdentity="h", acquireTime=stamp(5), leaseDurationSeconds=30))
    assert not is_expired(record, NOW, 2)


def test_a_renew_of_exactly_a_third_of_the_ttl_is_allowed_and_a_millisecond_more_is_not() -> None:
    Timing.of(30, 10, 2).check()
    Timing.of(10, 3.333, 2).check()
    with pytest.raises(TimingError, match=r"at most 3\.333s"):
        Timing.of(10, 3.334, 2).check()


def test_the_kill_grace_boundary_is_exact() -> None:
    # 2/3 of 30s (20s) + 2s detection + 5s grace + 2s skew = 29s < 30s; 6s would make 30s.
    timing = Timing.of(30, skew=2)
    assert timing.kill_grace_fits(5000, 2000)
    assert not timing.kill_grace_fits(6000, 2000)
    assert timing.longest_kill_grace(2000, step_ms=1000, most_ms=10_000) == 5000
    assert timing.longest_kill_grace(2000, step_ms=1, most_ms=10_000) == 5999
    assert Timing.of(9, skew=2).longest_kill_grace(2000, step_ms=1000, most_ms=10_000) is None


def test_renew_deadline_and_lease_duration_come_from_one_timing() -> None:
    timing = Timing.of(10.5, 3, 2)
    assert timing.renew_deadline == pytest.approx(7.0)
    assert timing.lease_duration_seconds == 11  # never shorter than the ttl
    assert Timing.of(60).renew_ms == 20_000


@given(
    ttl=st.integers(min_value=5, max_value=600),
    renew_ms=st.integers(min_value=1000, max_value=600_000),
)
def test_the_operator_and_the_sidecar_agree_on_renew_periods(ttl: int, renew_ms: int) -> None:
    """Every ttl/renew pair the operator injects is one the sidecar accepts, and the renew
    rule they share refuses the same pairs in both (the operator adds only its own bounds)."""
    renew = f"{renew_ms}ms"
    try:
        parse_config(
            gen.cronjob(
                "report", gen.annotated({"cronlock.io/ttl": f"{ttl}s", "cronlock.io/renew": renew})
            ),
            OperatorSettings(sidecar_image="img"),
        )
        operator_reason = None
    except InvalidConfig as error:
        operator_reason = error
    try:
        parse_options(
            ["run", "--lease", "default/x", "--ttl", f"{ttl}s", "--renew", renew, "--", "true"],
            {},
        )
        sidecar_accepts = True
    except ConfigError:
        sidecar_accepts = False
    shared_rule_refuses = renew_ms * 3 > ttl * 1000
    assert sidecar_accepts is not shared_rule_refuses
    if operator_reason is None:
        assert sidecar_accepts
    elif operator_reason.annotation == "cronlock.io/renew" and renew_ms < ttl * 1000:
        assert shared_rule_refuses, operator_reason


def test_clearing_an_expired_hold_leaves_the_lease_as_its_release_would() -> None:
    """The operator's clearing patch (reconcile/expiry.py) is the model's: guarded by the
    version read and the holder, and the result is the one `released` gives."""
    held = lease(holderIdentity="report-1-xyz_5678", renewTime=stamp(90), leaseTransitions=3)
    now = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    patch = cleared(held, "report-1-xyz_5678", now)
    assert patch[:2] == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
        {"op": "test", "path": "/spec/holderIdentity", "value": "report-1-xyz_5678"},
    ]
    assert apply_json_patch(held, patch) == released(held, "report-1-xyz_5678", now)
    record = read_lease(apply_json_patch(held, patch))
    assert (record.holder, record.last_holder, record.transitions) == ("", "report-1-xyz_5678", 3)
    with pytest.raises(ValueError, match="test failed"):  # another holder since: not applied
        apply_json_patch(lease(holderIdentity="report-2-new_9abc"), patch)


@pytest.mark.parametrize(
    ("spec", "holder", "token"),
    [
        (
            {"holderIdentity": "report-1-xyz_abcd1234", "leaseTransitions": 7},
            "report-1-xyz_abcd1234",
            7,
        ),
        ({}, "", 0),
        # Malformed as read_lease reads it: no holder, no token.
        ({"holderIdentity": 12, "leaseTransitions": "7"}, "", 0),
        ({"leaseTransitions": True}, "", 0),
    ],
)
def test_holder_of_and_token_of_read_as_read_lease_does(
    spec: dict[str, Any], holder: str, token: int
) -> None:
    body = lease(**spec)
    assert (holder_of(body), token_of(body)) == (holder, token)
    record = read_lease(body)
    assert (holder_of(body), token_of(body)) == (record.holder, record.transitions)
    assert holder_of({"spec": None}) == ""
    assert token_of({}) == 0


def test_with_token_sets_the_token_and_keeps_the_rest_untouched() -> None:
    body = lease(holderIdentity="report-1-xyz_abcd1234", leaseTransitions=3)
    written = with_token(body, 9)
    assert token_of(written) == 9
    assert token_of(body) == 3, "the Lease given is not changed"
    assert {**written, "spec": {}} == {**body, "spec": {}}
    assert holder_of(written) == "report-1-xyz_abcd1234"
    assert token_of(with_token({"metadata": {}}, 1)) == 1


def test_token_set_patches_the_token_alone() -> None:
    body = lease(holderIdentity="", leaseTransitions=2**31 - 1)
    patched = apply_json_patch(body, [token_set(0)])
    assert token_of(patched) == 0
    assert patched == with_token(body, 0)
