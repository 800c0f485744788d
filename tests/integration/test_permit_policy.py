"""Permits (sidecar lock/permits.py) from the side of pods on the runs' shared account.

The CronJob `report` asks `cronlock.io/permits: 3`, so its Lease holds permit 0 (the spec)
and the entries `cronlock.io/permit.1` and `.2`. Each pod writes with a token bound to it,
as the kubelet's projected tokens are; the chart's holders' policy lets it claim a free
permit as itself, renew and release its own, and nothing else: not another pod's entry,
not an entry at or beyond N, not the lock's N, and never two permits at once.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from cronlock_sidecar.lock import permits, ticks
from cronlock_sidecar.lock.model import Timing, claimed
from tests.integration.test_freeze import cli
from tests.integration.test_holder_policy import (
    LEASE,
    RUN_JOB,
    Pod,
    _can_read,
    _tick_of,
    guarded_on_shared,
    make_pod,
    refused,
)
from tests.support.controlplane import ControlPlane
from tests.support.kube import wait_for
from tests.support.objects import wait_event

pytestmark = pytest.mark.usefixtures("operator")

OTHER_JOB = "report-29000060"
Change = Callable[[dict[str, Any]], None]


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def claim(pod: Pod, index: int, job: str, *, tick: bool = True, as_: str = "") -> Change:
    """A claim of permit `index` as the sidecar writes it (permits.claimed_permit), with its
    tick record naming the Job, the holder `as_` (default: the pod itself)."""

    def change(lease: dict[str, Any]) -> None:
        holder = as_ or pod.identity
        record = (
            ticks.record_of(ticks.Tick("report", _tick_of(job), job, job + "-uid"), holder, "")
            if tick
            else None
        )
        lease.update(
            permits.claimed_permit(lease, index, holder, Timing.of(60), now(), job, record)
        )

    return change


def renew(index: int) -> Change:
    def change(lease: dict[str, Any]) -> None:
        lease.update(permits.renewed_permit(lease, index, Timing.of(60), now()))

    return change


def release(index: int, holder: str) -> Change:
    def change(lease: dict[str, Any]) -> None:
        lease.update(permits.released_permit(lease, index, holder, now()))

    return change


def annotate(key: str, value: str | None) -> Change:
    def change(lease: dict[str, Any]) -> None:
        notes = lease["metadata"].setdefault("annotations", {})
        if value is None:
            notes.pop(key, None)
        else:
            notes[key] = value

    return change


def entry(api: kubernetes.client.ApiClient, namespace: str, index: int) -> permits.Permit:
    lease = api.sanitize_for_serialization(
        kubernetes.client.CoordinationV1Api(api).read_namespaced_lease(LEASE, namespace)
    )
    return permits.read_permits(lease)[index]


def lease_says_permits(api: kubernetes.client.ApiClient, namespace: str, count: int) -> None:
    """Wait for the operator to write the lock's N on its Lease."""
    admin = kubernetes.client.CoordinationV1Api(api)
    wait_for(
        lambda: (
            (admin.read_namespaced_lease(LEASE, namespace).metadata.annotations or {}).get(
                "cronlock.io/permits"
            )
            == str(count)
        ),
        30,
        f"the Lease to say the lock's {count} permits",
    )


def test_a_pod_claims_renews_and_releases_one_permit_of_its_own_and_nothing_else(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    tmp_path: Path,
) -> None:
    guarded_on_shared(api, namespace, {"cronlock.io/permits": "3"})
    admin = kubernetes.client.CoordinationV1Api(api)
    # The operator wrote the lock's N on its Lease.
    lease_says_permits(api, namespace, 3)
    run = make_pod(api, controlplane, namespace, f"{RUN_JOB}-abcde", tmp_path)
    other = make_pod(api, controlplane, namespace, f"{OTHER_JOB}-fghij", tmp_path)
    intruder = make_pod(api, controlplane, namespace, "intruder", tmp_path)
    wait_for(lambda: _can_read(intruder, namespace), 30, "the holder Role for `shared`")

    # The lock's N is the operator's: no pod raises it (waited for: a new policy is
    # enforced a moment after it exists; the cluster admin undoes what got through).
    def raise_n_refused() -> bool:
        try:
            run.write(namespace, annotate("cronlock.io/permits", "16"))
        except kubernetes.client.ApiException as error:
            return error.status == 403 and "cronlock holder policy:" in str(error.body)
        admin.patch_namespaced_lease(
            LEASE, namespace, {"metadata": {"annotations": {"cronlock.io/permits": "3"}}}
        )
        return False

    wait_for(raise_n_refused, 30, "the holders' policy to be enforced")
    assert "only the operator writes the lock's number of permits" in refused(
        run, namespace, annotate("cronlock.io/permits", "16")
    )
    assert "only the operator writes" in refused(
        run, namespace, annotate("cronlock.io/permits", None)
    )

    # The legitimate claim of permit 1, with its tick record, is admitted.
    run.write(namespace, claim(run, 1, RUN_JOB))
    held = entry(api, namespace, 1)
    assert (held.holder, held.transitions, held.holder_job) == (run.identity, 1, RUN_JOB)

    # A pod taking two permits: another entry, or the spec, while it holds permit 1.
    assert f"pod {run.name} would hold 2 permits of this lock" in refused(
        run, namespace, claim(run, 2, RUN_JOB, tick=False)
    )

    def spec_claim(lease: dict[str, Any]) -> None:
        lease.update(claimed(lease, run.identity, Timing.of(60), now(), RUN_JOB))

    assert "would hold 2 permits" in refused(run, namespace, spec_claim)

    # Another pod's entry: taken over, renewed, released or deleted by the intruder.
    held_by_run = f"cronlock.io/permit.1 is held by {run.identity}"
    assert held_by_run in refused(intruder, namespace, claim(intruder, 1, "", tick=False))
    assert held_by_run in refused(intruder, namespace, renew(1))
    assert held_by_run in refused(intruder, namespace, release(1, intruder.identity))
    assert held_by_run in refused(intruder, namespace, annotate("cronlock.io/permit.1", None))
    # A free entry claimed in another pod's name, or as a Job not the writer's own.
    assert "none of these" in refused(
        intruder, namespace, claim(intruder, 2, OTHER_JOB, as_=other.identity)
    )
    assert "none of these" in refused(other, namespace, claim(other, 2, RUN_JOB))
    # An entry at or beyond the lock's N, and two entries in one write.
    assert "one of cronlock.io/permit.1 to cronlock.io/permit.2 (the lock has 3" in refused(
        other, namespace, claim(other, 3, OTHER_JOB, tick=False)
    )
    assert "permit.15" in refused(other, namespace, claim(other, 15, OTHER_JOB, tick=False))

    def two_entries(lease: dict[str, Any]) -> None:
        claim(other, 2, OTHER_JOB, tick=False)(lease)
        lease["metadata"]["annotations"]["cronlock.io/permit.3"] = "- - - - 0 -"

    assert "one permit entry at a time" in refused(other, namespace, two_entries)

    # A claim that keeps the permit's fencing token, or sets one far ahead.
    def token(value: int) -> Change:
        def change(lease: dict[str, Any]) -> None:
            claim(other, 2, OTHER_JOB)(lease)
            fields = lease["metadata"]["annotations"]["cronlock.io/permit.2"].split(" ")
            fields[4] = str(value)
            lease["metadata"]["annotations"]["cronlock.io/permit.2"] = " ".join(fields)

        return change

    assert "none of these" in refused(other, namespace, token(0))
    assert "none of these" in refused(other, namespace, token(1000))

    # A renewal that moves its acquire time or its Job; a release that keeps a holder's Job.
    def backdated(lease: dict[str, Any]) -> None:
        renew(1)(lease)
        fields = lease["metadata"]["annotations"]["cronlock.io/permit.1"].split(" ")
        fields[1] = fields[2] = "2020-01-01T00:00:00.000000Z"
        lease["metadata"]["annotations"]["cronlock.io/permit.1"] = " ".join(fields)

    assert "none of these" in refused(run, namespace, backdated)

    # The other run claims the free permit 2 (its tick record too); both renew their own.
    other.write(namespace, claim(other, 2, OTHER_JOB))
    run.write(namespace, renew(1))
    other.write(namespace, renew(2))
    assert entry(api, namespace, 2).holder == other.identity
    assert "cronlock.io/permit.2 is held by " + other.identity in refused(
        run, namespace, release(2, run.identity)
    )

    # Released: the holder gives back its own, transitions kept, and may then take another.
    run.write(namespace, release(1, run.identity))
    freed = entry(api, namespace, 1)
    assert (freed.holder, freed.transitions, freed.holder_job) == ("", 1, "")
    run.write(namespace, spec_claim)
    assert admin.read_namespaced_lease(LEASE, namespace).spec.holder_identity == run.identity
    # The next holder of permit 1 gets the next fencing token of that permit.
    third = make_pod(api, controlplane, namespace, "report-29000120-klmno", tmp_path)
    third.write(namespace, claim(third, 1, "report-29000120"))
    assert entry(api, namespace, 1).transitions == 2


def test_a_freeze_covers_the_whole_lock_and_leaves_every_permit_to_its_holder(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    tmp_path: Path,
) -> None:
    """`cronlock freeze` writes its notes on the lock's one document, whatever its N: every
    permit's runs read it there. The freezer's write leaves each entry as it was, and each
    holder may still renew and release its own (as `--stop-running` has it do)."""
    guarded_on_shared(api, namespace, {"cronlock.io/permits": "3"})
    admin = kubernetes.client.CoordinationV1Api(api)
    lease_says_permits(api, namespace, 3)
    run = make_pod(api, controlplane, namespace, f"{RUN_JOB}-abcde", tmp_path)
    other = make_pod(api, controlplane, namespace, f"{OTHER_JOB}-fghij", tmp_path)
    wait_for(lambda: _can_read(run, namespace), 30, "the holder Role for `shared`")
    wait_for(
        lambda: _admitted(run, namespace, claim(run, 1, RUN_JOB)), 30, "permit 1 to be claimed"
    )
    other.write(namespace, claim(other, 2, OTHER_JOB))
    before = [entry(api, namespace, index) for index in (1, 2)]

    frozen = cli(controlplane, "freeze", "report", "-n", namespace, "--for", "1h",
                 "--reason", "db upgrade", "--stop-running")  # fmt: skip
    assert frozen.returncode == 0, frozen.stderr
    notes = admin.read_namespaced_lease(LEASE, namespace).metadata.annotations
    assert notes["cronlock.io/frozen-stop"] == "true"
    assert notes["cronlock.io/permits"] == "3"
    assert [entry(api, namespace, index) for index in (1, 2)] == before
    # Frozen: the holders renew and give back their own permits, as stopping runs do.
    run.write(namespace, renew(1))
    run.write(namespace, release(1, run.identity))
    other.write(namespace, release(2, other.identity))
    assert [entry(api, namespace, index).holder for index in (1, 2)] == ["", ""]
    thawed = cli(controlplane, "unfreeze", "report", "-n", namespace)
    assert thawed.returncode == 0, thawed.stderr
    assert "cronlock.io/frozen-until" not in (
        admin.read_namespaced_lease(LEASE, namespace).metadata.annotations or {}
    )


def test_a_permit_taken_by_a_pod_that_is_no_run_is_broken_by_the_operator(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    tmp_path: Path,
) -> None:
    """The holders' policy cannot tell a run from another pod on the runs' account; the
    operator can, and clears such a pod's permit entry as it clears such a spec hold."""
    guarded_on_shared(api, namespace, {"cronlock.io/permits": "2"})
    intruder = make_pod(api, controlplane, namespace, "intruder", tmp_path)
    wait_for(lambda: _can_read(intruder, namespace), 30, "the holder Role for `shared`")
    lease_says_permits(api, namespace, 2)
    intruder.write(namespace, claim(intruder, 1, "", tick=False))
    [message] = wait_event(api, namespace, "report", "ForeignHolder")
    assert f"permit 1 was claimed by {intruder.identity}: pod intruder" in message
    assert entry(api, namespace, 1).holder == ""


def _admitted(pod: Pod, namespace: str, change: Change) -> bool:
    """Whether the write went through: the holders' policy may be enforced a moment late,
    but a legitimate write is admitted either way, so a 403 here means RBAC is not there."""
    try:
        pod.write(namespace, change)
    except kubernetes.client.ApiException as error:
        if error.status == 403:
            return False
        raise
    return True


def test_a_lock_of_one_permit_has_no_entry_a_pod_may_write(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    tmp_path: Path,
) -> None:
    """Without cronlock.io/permits the lock is the spec alone: an entry claimed beside it
    would be a second holder no older sidecar sees."""
    guarded_on_shared(api, namespace)
    run = make_pod(api, controlplane, namespace, f"{RUN_JOB}-abcde", tmp_path)
    wait_for(lambda: _can_read(run, namespace), 30, "the holder Role for `shared`")
    wait_for(
        lambda: _refused_now(api, run, namespace, claim(run, 1, RUN_JOB, tick=False)),
        30,
        "the holders' policy to be enforced",
    )
    assert "and none on a lock of one permit (the spec); this write changes " in refused(
        run, namespace, claim(run, 1, RUN_JOB, tick=False)
    )
    assert entry(api, namespace, 0).holder == ""


def _refused_now(
    admin: kubernetes.client.ApiClient, pod: Pod, namespace: str, change: Change
) -> bool:
    try:
        pod.write(namespace, change)
    except kubernetes.client.ApiException as error:
        return error.status == 403 and "cronlock holder policy:" in str(error.body)
    # Not enforced yet: what got through is taken back by the cluster admin, tried again.
    kubernetes.client.CoordinationV1Api(admin).patch_namespaced_lease(
        LEASE, namespace, {"metadata": {"annotations": {"cronlock.io/permit.1": None}}}
    )
    return False
