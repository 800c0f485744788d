"""The pod checker's permits mode (issue 58): a Lease's permits as the checker reads them,
each work's stop against its own permit's expiry, fencing tokens per permit, and the pod
work unit taking N from the trial and its permit from tick.env."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cronlock_sidecar.pod.rundir import tick_env
from tests.reliability.pod_checks import (
    WorkRecords,
    after_expiry,
    lease_end,
    lease_expiry,
    most_at_once,
    permits_held,
    token_regressions,
    tokens_by_permit,
)
from tests.reliability.pod_work import EVERY_MINUTE, NEVER, SHARED_FILES, WORK, PodSettings
from tests.reliability.pods import guarantee_held
from tests.support.node import LeaseVersion, PermitEntry, Work, permit_entries

OFFSET = 1_000_000.0
A, B, C = "x-1-abcde", "x-b-2-fghij", "x-c-3-klmno"
A_ID, B_ID, C_ID = f"{A}_0123abcd", f"{B}_4567ef01", f"{C}_89abcdef"


def micro(seconds: float) -> str:
    """A MicroTime `seconds` after OFFSET (the wall clock of these versions)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(OFFSET + seconds))
    return f"{stamp}.{round(seconds % 1 * 1e6):06d}Z"


def lease(
    spec_holder: str = "",
    spec_renewed: float | None = None,
    spec_transitions: int = 0,
    permits: int = 2,
    **entries: str,
) -> dict[str, Any]:
    """A Lease as the API server returns it, its permit annotations given by number."""
    annotations = {"cronlock.io/permits": str(permits)} if permits != 1 else {}
    annotations |= {f"cronlock.io/permit.{key[1:]}": value for key, value in entries.items()}
    spec: dict[str, Any] = {"leaseDurationSeconds": 13, "leaseTransitions": spec_transitions}
    if spec_holder:
        spec["holderIdentity"] = spec_holder
    if spec_renewed is not None:
        spec["renewTime"] = micro(spec_renewed)
    return {"metadata": {"name": "cronlock-x", "annotations": annotations}, "spec": spec}


def entry(holder: str, renewed: float, transitions: int, duration: int = 13) -> str:
    """Permit K's annotation value: `<holder> <acquire> <renew> <duration> <transitions> <job>`."""
    return f"{holder or '-'} {micro(renewed - 1)} {micro(renewed)} {duration} {transitions} -"


def version(
    document: dict[str, Any], last_holder: str = "", released_at: float | None = None
) -> LeaseVersion:
    if last_holder:
        document["metadata"]["annotations"]["cronlock.io/last-holder"] = last_holder
    if released_at is not None:
        document["metadata"]["annotations"]["cronlock.io/released-at"] = micro(released_at)
    return LeaseVersion.of(document, OFFSET)


# --- reading the permits -------------------------------------------------------------------------


def test_every_permit_is_read_the_spec_first_and_each_annotation_after() -> None:
    found = permit_entries(lease(A_ID, 100, 4, permits=3, p1=entry(B_ID, 101.5, 7), p2="junk"))
    assert [(e.number, e.holder, e.transitions) for e in found] == [
        (0, A_ID, 4),
        (1, B_ID, 7),
        (2, "", 0),
    ], "a malformed entry holds nothing"
    assert found[0].renew_time == pytest.approx(OFFSET + 100)
    assert found[1].renew_time == pytest.approx(OFFSET + 101.5)
    assert found[1].duration == 13


def test_one_permit_is_the_spec_alone_and_an_entry_beyond_n_is_nobodys() -> None:
    assert [e.number for e in permit_entries(lease(A_ID, 100, permits=1))] == [0]
    beyond = lease(A_ID, 100, permits=2, p1=entry(B_ID, 100, 1), p5=entry(C_ID, 100, 1))
    assert [e.holder for e in permit_entries(beyond)] == [A_ID, B_ID]


# --- each work against its own permit ------------------------------------------------------------


def test_a_works_expiry_is_its_own_permits_not_another_holders() -> None:
    versions = [
        version(lease(A_ID, 100, 1, p1=entry(B_ID, 101, 1))),
        version(lease(A_ID, 102, 1, p1=entry(B_ID, 110, 1))),
        # B renews its permit 1 long after A's last renewal of permit 0.
        version(lease(A_ID, 102, 1, p1=entry(B_ID, 120, 1))),
    ]
    assert permits_held(versions, A) == {0}
    assert permits_held(versions, B) == {1}
    assert lease_expiry(versions, A) == pytest.approx(115)
    assert lease_expiry(versions, B) == pytest.approx(133)
    assert after_expiry(Work(A, 99.0, 116.0), versions) == pytest.approx(1.0), "past its own"
    assert lease_end(versions, A) == "held"


def test_a_permit_given_back_keeps_its_last_renewal_and_ends_released() -> None:
    versions = [
        version(lease(A_ID, 100, 1, p1=entry(B_ID, 101, 3))),
        version(lease(A_ID, 104, 1, p1=entry("", 103, 3)), last_holder=B_ID, released_at=105),
    ]
    assert lease_expiry(versions, B) == pytest.approx(116)
    assert lease_end(versions, B) == "released"
    # A later release by another holder does not move B's expiry.
    versions.append(version(lease("", 110, 1, p1=entry("", 103, 3)), A_ID, released_at=111))
    assert lease_expiry(versions, B) == pytest.approx(116)
    assert lease_expiry(versions, A) == pytest.approx(123)


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        # Permit 1 taken over by C after B's expiry.
        (version(lease(A_ID, 100, 1, p1=entry(C_ID, 116, 4))), "lost"),
        # Cleared (by the operator) after B's expiry.
        (version(lease(A_ID, 100, 1, p1=entry("", 101, 3)), B_ID, released_at=115), "lost"),
        # Permit 1 given back in time, but the release on record is A's.
        (version(lease("", 100, 1, p1=entry("", 101, 3)), A_ID, released_at=102), "lost"),
    ],
)
def test_how_a_permits_hold_ended(after: LeaseVersion, expected: str) -> None:
    before = version(lease(A_ID, 100, 1, p1=entry(B_ID, 101, 3)))
    assert lease_end([before, after], B) == expected


def test_a_pod_seen_only_in_a_release_of_one_of_several_permits_has_no_expiry() -> None:
    # Which permit it held is unknown: its work is counted as one without a lease.
    versions = [version(lease("", 100, 1, p1=entry("", 101, 3)), B_ID, released_at=102)]
    assert lease_expiry(versions, B) is None


# --- fencing tokens per permit -------------------------------------------------------------------


def test_a_token_that_goes_back_on_one_permit_is_found_whatever_the_others_do() -> None:
    versions = [
        version(lease(A_ID, 100, 5, p1=entry(B_ID, 100, 2))),
        version(lease(A_ID, 101, 5, p1=entry(C_ID, 101, 3))),
        version(lease(C_ID, 102, 6, p1=entry("", 101, 3))),
    ]
    assert token_regressions(versions) == []
    assert tokens_by_permit(versions) == {0: 6, 1: 3}
    versions.append(version(lease(C_ID, 103, 6, p1=entry(B_ID, 103, 2))))
    assert token_regressions(versions) == ["permit 1: token 2 after 3"]


def test_versions_read_without_permits_have_no_tokens_to_compare() -> None:
    bare = LeaseVersion("cronlock-x", A_ID, OFFSET, 13.0, "", None, OFFSET)
    assert tokens_by_permit([bare]) == {}
    assert lease_expiry([bare], A) == pytest.approx(13)
    assert bare.permits == ()
    assert PermitEntry(0, A_ID, OFFSET, 13.0, 0) == permit_entries(lease(A_ID, 0, permits=1))[0]


def test_the_guarantee_fails_on_a_token_gone_back() -> None:
    keys = (
        "overlaps",
        "tracker_overlaps",
        "works_past_expiry",
        "delayed",
        "timed_out_trials",
        "leftover_works",
        "corrupted_cronjobs",
        "fault_errors",
    )
    clean: dict[str, Any] = dict.fromkeys(keys, 0) | {
        "works_without_lease": [],
        "token_regressions": [],
    }
    assert guarantee_held(clean)
    assert not guarantee_held(clean | {"token_regressions": ["permit 1: token 2 after 3"]})
    # A report from before the check (the soak's) has no token_regressions: judged without.
    assert guarantee_held(
        {key: value for key, value in clean.items() if key != "token_regressions"}
    )


# --- settings ------------------------------------------------------------------------------------


def test_a_permits_value_the_lock_cannot_have_is_refused() -> None:
    with pytest.raises(ValueError, match="1 to 16 permits"):
        PodSettings(permits=17)
    with pytest.raises(ValueError, match="1 to 16 permits"):
        PodSettings(permits=0)
    with pytest.raises(ValueError, match="1 to 6 CronJobs"):
        PodSettings(cronjobs=7)
    assert PodSettings(permits=2, cronjobs=3, schedule=EVERY_MINUTE).permits == 2
    assert PodSettings().schedule == NEVER


# --- the pod work unit: N from the trial, its permit from tick.env -------------------------------


def start_pod_work(
    shared: Path, run_dir: Path, port: int, pod: str, seconds: float
) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-c", WORK, str(shared), str(run_dir / "fencing-token")]
    return subprocess.Popen(
        [*argv, "127.0.0.1", str(port), f"{seconds}"], env=dict(os.environ, HOSTNAME=pod)
    )


def run_dir(base: Path, name: str, token: int, permit: int) -> Path:
    """A pod's /var/run/cronlock: its token, and tick.env as the sidecar writes it."""
    directory = base / name
    directory.mkdir()
    (directory / "fencing-token").write_text(str(token))
    (directory / "tick.env").write_text(tick_env(None, None, permit=permit))
    return directory


def test_two_pods_on_two_permits_work_at_once_and_a_third_is_an_overlap(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    for name in SHARED_FILES:
        (shared / name).touch()
    (shared / "slots").write_text("2\n")
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    runs = [
        run_dir(tmp_path, "a", 3, 0),
        run_dir(tmp_path, "b", 5, 1),
        run_dir(tmp_path, "c", 6, 1),
    ]
    works = [start_pod_work(shared, runs[0], port, "pod-a", 60)]
    connections = [server.accept()[0]]
    records = WorkRecords(shared / "events.jsonl")
    try:
        works.append(start_pod_work(shared, runs[1], port, "pod-b", 60))
        connections.append(server.accept()[0])
        deadline = time.monotonic() + 30
        while records.counts["start"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
            records.read()
        assert records.counts["start"] == 2
        third = start_pod_work(shared, runs[2], port, "pod-c", 0)
        connections.append(server.accept()[0])
        assert third.wait(timeout=30) == 0
    finally:
        for work in works:
            work.kill()
            work.wait(timeout=30)
        for connection in connections:
            connection.close()
        server.close()
    records.read()
    counts = records.permit_counts()
    assert counts == {
        0: {"runs": 1, "refused": 0, "overlaps": 0},
        1: {"runs": 2, "refused": 0, "overlaps": 1},
    }, "the third, on permit 1 while two ran, is the overlap"
    events = [json.loads(line) for line in (shared / "events.jsonl").read_text().splitlines()]
    assert {(e["pod"], e["permit"], e["token"]) for e in events} == {
        ("pod-a", 0, 3),
        ("pod-b", 1, 5),
        ("pod-c", 1, 6),
    }
    # Each permit fences in its own store.
    assert set((shared / "fencing-store.1").read_text().split()) == {"5", "6"}
    assert set((shared / "fencing-store.0").read_text().split()) == {"3"}


def test_an_older_token_on_the_same_permit_is_refused_in_a_pod(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    for name in SHARED_FILES:
        (shared / name).touch()
    (shared / "slots").write_text("2\n")
    (shared / "fencing-store.1").write_text("9\n")
    server = socket.create_server(("127.0.0.1", 0))
    try:
        work = start_pod_work(shared, run_dir(tmp_path, "a", 4, 1), server.getsockname()[1], "p", 0)
        connection, _ = server.accept()
        with connection:
            assert work.wait(timeout=30) == 0
    finally:
        server.close()
    records = WorkRecords(shared / "events.jsonl")
    records.read()
    assert records.permit_counts()[1]["refused"] >= 1
    assert 0 not in records.permit_counts()


def test_another_free_permit_renewed_later_does_not_move_a_released_holders_expiry() -> None:
    # B gave back permit 1 (renewed last at 103); permit 2, free too, was renewed at 108
    # by a holder that gave it back before: B's expiry stays its own permit's.
    versions = [
        version(lease(A_ID, 100, 1, permits=3, p1=entry(B_ID, 103, 2), p2=entry("", 108, 5))),
        version(
            lease(A_ID, 104, 1, permits=3, p1=entry("", 103, 2), p2=entry("", 108, 5)),
            last_holder=B_ID,
            released_at=109,
        ),
    ]
    assert lease_expiry(versions, B) == pytest.approx(116)
    assert lease_end(versions, B) == "released"


@pytest.mark.parametrize(
    ("spans", "most"),
    [
        ([], 0),
        ([(0.0, 5.0)], 1),
        ([(0.0, 5.0), (5.0, 9.0)], 1),  # one starts as the other stops
        ([(0.0, 5.0), (1.0, 9.0), (6.0, 8.0)], 2),
        ([(0.0, 5.0), (1.0, 9.0), (2.0, 3.0)], 3),
        ([(0.0, None), (1.0, None), (2.0, 3.0)], 3),  # still running
    ],
)
def test_most_at_once_counts_the_works_of_the_busiest_moment(
    spans: list[tuple[float, float | None]], most: int
) -> None:
    works = [Work(f"w-{i}-abcde", start, stop) for i, (start, stop) in enumerate(spans)]
    assert most_at_once(works) == most
