"""`cronlock-sidecar run --permits N` as real processes against a real API server: at most
N works at once, each run worked or skipped with its line, tokens growing per permit, and
each tick worked once across permits."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cronlock_sidecar.lock.ticks import read_record
from tests.support.controlplane import ControlPlane
from tests.support.kube import wait_for
from tests.support.papers import marked_block, run_shell
from tests.support.paths import ROOT, SIDECAR
from tests.support.processes import finish

pytestmark = pytest.mark.controlplane

SKIPPED, CONFIG = 75, 78

# CMD: records `<permit> <token> <start> <end>` when it ends (its own clock: when it worked),
# having slept argv[2] seconds, or until the file argv[3] exists when argv[2] is "until".
RECORDED_WORK = textwrap.dedent(
    """
    import os, sys, time
    start = time.time()
    if sys.argv[2] == "until":
        for _ in range(1200):
            if os.path.exists(sys.argv[3]):
                break
            time.sleep(0.05)
    else:
        time.sleep(float(sys.argv[2]))
    end = time.time()
    with open(sys.argv[1], "a") as log:
        log.write(
            f"{os.environ['CRONLOCK_PERMIT']} {os.environ['CRONLOCK_FENCING_TOKEN']} "
            f"{start} {end} {os.environ['CRONLOCK_TICK'] or '-'}\\n"
        )
    """
)


def run(
    controlplane: ControlPlane, lease: str, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(SIDECAR), "run", "--lease", lease, "--ttl", "10s", *args],
        env={**controlplane.env, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def work(log: Path, *how: str) -> list[str]:
    return ["--", sys.executable, "-c", RECORDED_WORK, str(log), *how]


def held(controlplane: ControlPlane, namespace: str, name: str) -> bool:
    """Whether the Lease exists and its spec (permit 0) names a holder."""
    try:
        return "holderIdentity" in controlplane.lease_json(namespace, name).get("spec", {})
    except AssertionError:  # not created yet: kubectl's NotFound
        return False


def worked(log: Path) -> list[tuple[int, int, float, float, str]]:
    """Each work's (permit, token, start, end, tick), in the order they started."""
    if not log.exists():
        return []
    rows = [line.split() for line in log.read_text().splitlines()]
    return sorted(
        ((int(p), int(t), float(s), float(e), tick) for p, t, s, e, tick in rows),
        key=lambda row: row[2],
    )


def most_at_once(rows: list[tuple[int, int, float, float, str]]) -> int:
    """The most works running at one moment (an end and a start at one time: not both)."""
    events = sorted([(start, 1) for _, _, start, _, _ in rows] + [(end, -1) for *_, end, _ in rows])
    running = most = 0
    for _, change in events:
        running += change
        most = max(most, running)
    return most


def test_six_runs_on_two_permits_two_work_and_four_skip_naming_both_holders(
    controlplane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    cleanup: list[subprocess.Popen[str]],
) -> None:
    log, finished = tmp_path / "worked", tmp_path / "finished"
    lease = f"{namespace}/permits-skip"
    contenders = [
        run(controlplane, lease, "--permits", "2", *work(log, "until", str(finished)))
        for _ in range(6)
    ]
    cleanup.extend(contenders)

    def decided() -> bool:
        return sum(process.poll() is not None for process in contenders) >= 4

    # The two holders work until every other run has decided.
    wait_for(decided, timeout=60, what="four of six runs to skip")
    finished.touch()
    results = [finish(process) for process in contenders]

    assert sorted(code for code, _ in results) == [0, 0] + [SKIPPED] * 4, results
    rows = worked(log)
    assert sorted((permit, token) for permit, token, *_ in rows) == [(0, 1), (1, 1)]
    assert most_at_once(rows) == 2
    skip_line = re.compile(
        rf"all 2 permits of lock {re.escape(lease)} are held: (\S+) \(permit 0\), (\S+) "
        r"\(permit 1\); skipping this run$"
    )
    for code, stderr in results:
        if code == SKIPPED:
            lines = [line for line in stderr.splitlines() if "permits of lock" in line]
            assert len(lines) == 1, stderr
            match = skip_line.search(lines[0])
            assert match, lines[0]
            assert match.group(1) != match.group(2)
    document = controlplane.lease_json(namespace, "permits-skip")
    annotations = document["metadata"]["annotations"]
    assert annotations["cronlock.io/permits"] == "2"
    # Both released: the spec has no holder, permit 1's entry none, each token kept.
    assert "holderIdentity" not in document["spec"]
    assert document["spec"]["leaseTransitions"] == 1
    assert annotations["cronlock.io/permit.1"].split(" ")[0] == "-"
    assert annotations["cronlock.io/permit.1"].split(" ")[4] == "1"


@pytest.mark.timeout(120)
def test_waiting_runs_on_two_permits_never_work_three_at_once_and_tokens_grow_per_permit(
    controlplane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    cleanup: list[subprocess.Popen[str]],
) -> None:
    log = tmp_path / "worked"
    lease = f"{namespace}/permits-wait"
    contenders = [
        run(
            controlplane,
            lease,
            "--permits",
            "2",
            "--policy",
            "wait",
            "--wait-timeout",
            "60s",
            *work(log, "0.7"),
        )
        for _ in range(7)
    ]
    cleanup.extend(contenders)
    results = [finish(process, timeout=90) for process in contenders]

    assert [code for code, _ in results] == [0] * 7, [stderr for _, stderr in results]
    rows = worked(log)
    assert len(rows) == 7
    assert most_at_once(rows) == 2, rows
    for permit in (0, 1):
        held = [row for row in rows if row[0] == permit]
        assert held, f"permit {permit} never worked: {rows}"
        for (_, token, _, end, _), (_, next_token, start, _, _) in itertools.pairwise(held):
            assert token < next_token, held  # each new holder of a permit: a newer token
            assert end <= start, held  # one work per permit at a time
    assert {permit for permit, *_ in rows} == {0, 1}
    assert sorted(token for _, token, *_ in rows)[-1] <= 7


def test_two_runs_of_one_tick_with_two_permits_free_work_it_once(
    controlplane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    cleanup: list[subprocess.Popen[str]],
) -> None:
    log, finished = tmp_path / "worked", tmp_path / "finished"
    lease = f"{namespace}/permits-tick"
    tick = datetime.now(UTC).replace(second=0, microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
    runs = [
        run(
            controlplane,
            lease,
            "--permits",
            "2",
            "--tick",
            tick,
            "--tick-of",
            "report",
            "--run-id",
            run_id,
            *work(log, "until", str(finished)),
        )
        for run_id in ("first-run", "second-run")
    ]
    cleanup.extend(runs)
    wait_for(
        lambda: any(process.poll() is not None for process in runs),
        timeout=60,
        what="one of the tick's two runs to skip",
    )
    finished.touch()
    results = sorted(finish(process) for process in runs)

    [(ran, _), (skipped, line)] = results
    assert (ran, skipped) == (0, SKIPPED), results
    assert re.search(
        rf"already ran: tick {tick} of report on lock {re.escape(lease)} was claimed by .* for "
        rf"tick {tick}; skipping this run",
        line,
    ), line
    [(permit, token, _, _, worked_tick)] = worked(log)
    assert (permit, token, worked_tick) == (0, 1, tick)
    annotations = controlplane.lease_json(namespace, "permits-tick")["metadata"]["annotations"]
    # The other permit was never taken: one claim, one tick record.
    assert "cronlock.io/permit.1" not in annotations
    record = read_record(annotations, "report")
    assert record is not None
    assert record.at.strftime("%Y-%m-%dT%H:%M:%SZ") == tick


def test_run_refuses_a_lock_that_says_another_number_of_permits(
    controlplane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    cleanup: list[subprocess.Popen[str]],
) -> None:
    """While a run of N = 2 holds, a run requiring 3 exits 78 and writes nothing; once no
    permit of it is held, a run requiring 3 writes its N with its claim."""
    log = tmp_path / "worked"
    done = tmp_path / "done"
    lease = f"{namespace}/permits-agree"
    first = run(controlplane, lease, "--permits", "2", *work(log, "until", str(done)))
    cleanup.append(first)
    wait_for(lambda: held(controlplane, namespace, "permits-agree"), 30, "the first run to hold")
    before = controlplane.lease_json(namespace, "permits-agree")

    other = run(controlplane, lease, "--permits", "3", *work(log, "0"))
    cleanup.append(other)
    code, stderr = finish(other)

    assert code == CONFIG, stderr
    assert (
        f"lease {lease} says '2' permits (cronlock.io/permits) but this run requires 3 "
        "(--permits): every run sharing a lock must give the same number" in stderr
    )
    after = controlplane.lease_json(namespace, "permits-agree")
    assert after["metadata"]["annotations"]["cronlock.io/permits"] == "2"
    assert after["spec"]["holderIdentity"] == before["spec"]["holderIdentity"]
    # A run that names no N follows the lock's: permit 1 of 2 beside the first.
    plain = run(controlplane, lease, *work(log, "0"))
    cleanup.append(plain)
    assert finish(plain)[0] == 0
    done.touch()
    assert finish(first)[0] == 0
    assert len(worked(log)) == 2
    # No permit held now: the run of 3 writes its N and works.
    again = run(controlplane, lease, "--permits", "3", *work(log, "0"))
    cleanup.append(again)
    assert finish(again)[0] == 0
    annotations = controlplane.lease_json(namespace, "permits-agree")["metadata"]["annotations"]
    assert annotations["cronlock.io/permits"] == "3"


def test_the_usage_papers_permits_command_takes_a_permit_and_tells_the_command(
    controlplane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    script = tmp_path / "export.sh"
    script.write_text(
        '#!/bin/sh\necho "permit $CRONLOCK_PERMIT token $CRONLOCK_FENCING_TOKEN" > exported\n'
    )
    script.chmod(0o755)
    block = marked_block(ROOT / "docs" / "USAGE.md", "run-permits")
    assert "reports/cronlock-exports" in block
    block = block.replace("reports/", f"{namespace}/")
    env = dict(controlplane.env, PATH=f"{SIDECAR.parent}:{controlplane.env['PATH']}")
    # Another run holds permit 0: the paper's command takes permit 1 at once.
    holder = run(
        controlplane,
        f"{namespace}/cronlock-exports",
        "--permits",
        "2",
        *work(tmp_path / "worked", "until", str(tmp_path / "finished")),
    )
    try:
        wait_for(
            lambda: held(controlplane, namespace, "cronlock-exports"),
            timeout=30,
            what="the first run to hold permit 0",
        )
        run_shell(block, env, tmp_path, timeout=60)
    finally:
        (tmp_path / "finished").touch()
        assert finish(holder)[0] == 0
    assert (tmp_path / "exported").read_text() == "permit 1 token 1\n"
    annotations = controlplane.lease_json(namespace, "cronlock-exports")["metadata"]["annotations"]
    assert annotations["cronlock.io/permits"] == "2"
