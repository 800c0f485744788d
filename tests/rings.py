"""Runs the test rings side by side, one pytest process each: `make test`'s last step.

    python -m tests.rings [PYTEST ARGS...]

The suite spends most of its time waiting on real parts (a lease to expire, a minute tick, a
pod to stop), not computing, so rings that share nothing run at once: each process starts
its own control plane (on free ports, in its own `.testenv/pytest-PID`), and only the e2e
ring starts the real node 1 (and 2), whose kubelet and containerd own host paths
(/var/lib/kubelet, /run/containerd) and so run once per machine; the clusters ring's
nodes 3 and 4, each its own control plane's, share them with it as node 2 does. The
rings together are exactly pyproject's `testpaths`: a ring missing one, or naming one
twice, is refused before anything starts. A ring may also take files (or folders) out of
a testpath another ring runs (the e2e tests are two rings, on node 1 and on node 5): that
ring runs them, the other `--ignore`s them.

A ring may first run shell commands in its process (BEFORE: the builds only it needs, while
the others already run). Each process writes to `.testenv/rings/NAME.log`; a line every
minute says how far each has got, and each log is printed whole when its ring ends, so
CI's log keeps everything.
At the end, the rings' times and which ring was the critical path, and by how much.
The exit status is the first failing ring's (0 when all pass). Ctrl-C (or a SIGTERM) is
passed to every ring as SIGINT, so each tears its control plane down.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent

# Which testpaths share a process. unit and integration run one after the other in one
# process (unit needs no control plane, and alone it ends in about two minutes), beside the
# e2e ring, the longest. The longwatch ring holds the API-server tests that mostly watch a
# long window go by (test_neighbours' five quiet minutes): in a process of their own they
# wait beside the others instead of in the unit+integration ring's line.
# The clusters ring (two clusters of their own, nodes 3 and 4, never node 1 or 2) mostly
# waits out its minutely ticks, beside the others.
# The e2e tests are two rings, each its own control plane and node, split by their
# measured times (docs/DEVELOPMENT.md): "e2e" on node 1, with everything that needs node 2
# (the fleet, the pod checker), the registry (release, source install) or node 1's link
# (stores on the node); "e2e-b" (ENV: CRONLOCK_E2E_NODE=5) on node 5, a cluster of its own,
# the files below, which need only the node their pods run on. "e2e" runs the rest of
# tests/e2e: a new e2e test file lands there.
# The integration tests are two rings too, split by their measured times (docs/DEVELOPMENT.md:
# 20:37 in one process, the critical path at 22:18 with the unit tests before them):
# "integration-b" runs the reliability checker's trials, the stores', the papers' and the
# operator's files below; "unit+integration" runs the rest, and a new integration test file
# lands there. Neither builds a Go test tool: the "tools" ring builds them (4:46 on a fresh
# machine at fbee60d, when unit+integration built them before its tests and was the critical
# path by 2:36) and runs the unit and integration files that use one, so no other ring's
# tests wait for a build.
RINGS: dict[str, tuple[str, ...]] = {
    "unit+integration": ("tests/unit", "tests/integration"),
    # With issue 58's API-server files (16 tests, 60 s alone): at f484d00 the
    # unit+integration ring was the critical path (17:06 fresh) and longwatch ended at
    # 6:01 warm and 11:02 fresh.
    "longwatch": (
        "tests/longwatch",
        "tests/integration/test_max_hold_stores.py",
        "tests/integration/test_permit_policy.py",
        "tests/integration/test_permit_sharing.py",
        "tests/integration/test_permit_status.py",
        "tests/integration/test_queue.py",
        "tests/integration/test_run_permits.py",
    ),
    "e2e": ("tests/e2e",),
    "e2e-b": (
        "tests/e2e/test_failures.py",
        "tests/e2e/test_flood.py",
        "tests/e2e/test_max_hold.py",
        "tests/e2e/test_missed_runs.py",
        "tests/e2e/test_neighbours_on_node.py",
        "tests/e2e/test_overlap.py",
        "tests/e2e/test_policies.py",
        "tests/e2e/test_queue_permits.py",
        "tests/e2e/test_repeated_skips.py",
        "tests/e2e/test_shared_lock.py",
    ),
    "clusters": ("tests/clusters",),
    "integration-b": (
        "tests/integration/test_operator.py",
        "tests/integration/test_papers_run.py",
        "tests/integration/test_postgres_tenants.py",
        "tests/integration/test_redis_failover.py",
        "tests/integration/test_redis_tenants.py",
        "tests/integration/test_reliability.py",
        "tests/integration/test_sidecar.py",
        "tests/integration/test_status.py",
        "tests/integration/test_store_permits.py",
        "tests/integration/test_store_permits_redis.py",
        "tests/integration/test_store_ticks.py",
        "tests/integration/test_stores.py",
        "tests/integration/test_two_releases.py",
        "tests/integration/test_uninstall.py",
        # Last (pytest runs the files in this order): its orphaning-delete test failed twice
        # when the garbage collector's graph did not hold the new Lease yet; it now waits
        # for the graph to hold it (docs/DEVELOPMENT.md).
        "tests/integration/test_holder_policy.py",
    ),
    # The files that run a Go test tool (tests/support/tools.py gotool, charts/readme's
    # helm-docs, tests/support/prometheus.py's promqleval), after BEFORE built them all.
    "tools": (
        "tests/unit/test_argocd_health.py",
        "tests/unit/test_chart_readme.py",
        "tests/unit/test_workflows.py",
        "tests/integration/chart/test_monitoring.py",
        "tests/integration/test_krew.py",
        "tests/integration/test_schedule_robfig.py",
    ),
}
# Environment variables a ring's process gets on top of `make test`'s.
ENV: dict[str, dict[str, str]] = {"e2e-b": {"CRONLOCK_E2E_NODE": "5"}}
# Shell commands a ring runs, in its own log, before its pytest starts (a failing one fails
# the ring). `make test` builds only what the e2e ring needs before the rings start; the
# tools ring builds the other Go test tools here, while the other rings already run, and
# lints the workflows with one of them. No other unit or integration file runs a tool (an
# e2e test that asks for one waits on gotool's lock: built once).
BEFORE: dict[str, tuple[str, ...]] = {
    "tools": (
        "tests/controlplane/prebuild --tools",
        '"$(tests/controlplane/gotool actionlint)" -no-color',
    ),
    # The previous release's images, which only the e2e ring's upgrade test needs, near its
    # end (it imports them itself, and waits on the images' lock if they are still being
    # built): built here, in the ring with the most time to spare (about 6 of the rings'
    # 14-18 minutes), not before the unit and integration tests, where they made that ring
    # the critical path (244 s of its 310 s set-up at 32441e7, docs/DEVELOPMENT.md).
    "longwatch": ("nice -n 10 tests/controlplane/images --previous >/dev/null",),
}
REPORT_EVERY = 60.0
FAILURE_LINE = 600  # characters of one failure's line printed again at the end
STOP_GRACE = 120.0
PROGRESS = re.compile(r"\[\s*(\d+)%\]\s*$")
SUMMARY = re.compile(r"^=+ (.* in [\d.]+s.*) =+$")


def configured_testpaths(root: Path = ROOT) -> list[str]:
    with (root / "pyproject.toml").open("rb") as file:
        return list(tomllib.load(file)["tool"]["pytest"]["ini_options"]["testpaths"])


def within(part: str, whole: str) -> bool:
    """Whether `part` is a file or folder inside `whole` (not `whole` itself)."""
    return part != whole and PurePosixPath(part).is_relative_to(PurePosixPath(whole))


def check_rings(
    rings: dict[str, tuple[str, ...]], paths: Sequence[str], root: Path | None = None
) -> None:
    """Every testpath in exactly one ring, and nothing else: raises SystemExit saying which.

    A ring may name a part of a testpath (a file or folder in it) that another ring names
    whole: that ring runs the part, the other ignores it (`ignored`). With `root`, each
    part must exist there."""
    named = [path for ring in rings.values() for path in ring]
    twice = sorted({path for path in named if named.count(path) > 1})
    missing = sorted(set(paths) - set(named))
    parts = sorted({path for path in named if path not in paths})
    extra = [path for path in parts if not any(within(path, whole) for whole in paths)]
    absent = [
        path
        for path in parts
        if path not in extra and root is not None and not (root / path).exists()
    ]
    beside = sorted(
        f"{part} is in the same ring as {whole}, which holds it"
        for ring in rings.values()
        for part in ring
        for whole in ring
        if within(part, whole)
    )
    problems = [
        *(f"{path} is in more than one ring" for path in twice),
        *(f"{path} is a testpath in no ring: its tests would never run" for path in missing),
        *(f"{path} is in a ring but not in pyproject's testpaths" for path in extra),
        *(f"{path} is in a ring but does not exist: a ring would run nothing" for path in absent),
        *beside,
    ]
    if problems:
        raise SystemExit("rings: " + "; ".join(problems) + " (tests/rings.py RINGS)")


def ignored(rings: dict[str, tuple[str, ...]], name: str) -> tuple[str, ...]:
    """What ring `name` leaves out of its paths: the parts of them other rings run."""
    return tuple(
        part
        for other, theirs in rings.items()
        if other != name
        for part in theirs
        for whole in rings[name]
        if within(part, whole)
    )


def critical_path(times: dict[str, float]) -> str:
    """Which ring took longest (`make test` waits for it), and by how much over the next."""
    ordered = sorted(times.items(), key=lambda item: item[1], reverse=True)
    (slowest, longest), rest = ordered[0], ordered[1:]
    if not rest:
        return f"rings: the critical path is {slowest} ({clock(longest)}), the only ring"
    after, next_time = rest[0]
    return (
        f"rings: the critical path is {slowest} ({clock(longest)}), "
        f"{clock(longest - next_time)} longer than {after} ({clock(next_time)})"
    )


@dataclass
class Ring:
    name: str
    paths: tuple[str, ...]
    root: Path
    before: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ended: float | None = None
    code: int | None = None
    shown: bool = False

    @property
    def log(self) -> Path:
        return self.root / ".testenv" / "rings" / f"{self.name}.log"

    def start(self, args: Sequence[str]) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            skip = [f"--ignore={path}" for path in self.ignore]
            pytest = [sys.executable, "-m", "pytest", *args, *skip, *self.paths]
            script = "set -e; " + "".join(f"{command}; " for command in self.before)
            self.process = subprocess.Popen(
                ["bash", "-c", script + 'exec "$@"', self.name, *pytest] if self.before else pytest,
                cwd=self.root,
                env={**os.environ, **self.env},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.started = time.monotonic()

    def poll(self) -> bool:
        """Whether the ring has ended (recording its status and time the first time)."""
        assert self.process is not None
        if self.code is None and (code := self.process.poll()) is not None:
            self.code, self.ended = code, time.monotonic()
        return self.code is not None

    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def progress(self) -> str:
        found = [m.group(1) for line in self.text().splitlines() if (m := PROGRESS.search(line))]
        return f"{found[-1]}%" if found else "starting"

    def summary(self) -> str:
        found = [m.group(1) for line in self.text().splitlines() if (m := SUMMARY.match(line))]
        return found[-1] if found else "no summary (see its log)"

    def failures(self) -> list[str]:
        """What failed, as the ring's short test summary and evidence section say it."""
        return failures(self.text())


def failures(text: str) -> list[str]:
    """The FAILED and ERROR lines of pytest's short test summary and the evidence folders
    of a ring's log, each cut to FAILURE_LINE characters: printed again after every ring's
    summary, the last lines of the output, so that a reader shown only its end (CI's page
    elides the middle) still learns what failed, how, and where its evidence is."""
    found: list[str] = []
    evidence = False
    for line in text.splitlines():
        if line.startswith("=") and line.rstrip("= ").lstrip("= "):
            evidence = "evidence of the failed tests" in line
            continue
        if line.startswith(("FAILED ", "ERROR ")):
            found.append(line)
        elif evidence and line.strip():
            found.append(f"evidence: {line.strip()}")
    return [line if len(line) <= FAILURE_LINE else line[: FAILURE_LINE - 1] + "…" for line in found]


def clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def show(ring: Ring) -> None:
    print(f"\n{'#' * 20} ring {ring.name} ({' '.join(ring.paths)}): exit {ring.code}, "
          f"{clock(ring.elapsed())} {'#' * 20}", flush=True)  # fmt: skip
    sys.stdout.write(ring.text())
    sys.stdout.flush()
    ring.shown = True


def run(
    args: Sequence[str],
    rings: dict[str, tuple[str, ...]] = RINGS,
    root: Path = ROOT,
    before: dict[str, tuple[str, ...]] | None = None,
    env: dict[str, dict[str, str]] | None = None,
) -> int:
    check_rings(rings, configured_testpaths(root), root)
    steps = BEFORE if before is None else before
    unknown = sorted(set(steps) - set(rings))
    if unknown:
        raise SystemExit(f"rings: steps before {', '.join(unknown)}, which is no ring")
    environments = ENV if env is None else env
    unknown = sorted(set(environments) - set(rings))
    if unknown:
        raise SystemExit(f"rings: environment for {', '.join(unknown)}, which is no ring")
    running = [
        Ring(
            name,
            paths,
            root,
            steps.get(name, ()),
            ignored(rings, name),
            environments.get(name, {}),
        )
        for name, paths in rings.items()
    ]
    stopping: list[float] = []  # when a stop was asked for
    killed = False

    def stop(_signum: int, _frame: FrameType | None) -> None:
        stopping.append(time.monotonic())
        for ring in running:
            if ring.process is not None and ring.process.poll() is None:
                ring.process.send_signal(signal.SIGINT)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    start = time.monotonic()
    for ring in running:
        ring.start(args)
        print(f"rings: started {ring.name} ({' '.join(ring.paths)}), log {ring.log}", flush=True)
    reported = start
    while any(ring.code is None for ring in running):
        time.sleep(1.0)
        for ring in running:
            if ring.poll() and not ring.shown:
                show(ring)
        if stopping and not killed and time.monotonic() - stopping[0] > STOP_GRACE:
            killed = True
            for ring in running:
                if ring.process is not None and ring.process.poll() is None:
                    ring.process.kill()
        if time.monotonic() - reported >= REPORT_EVERY:
            reported = time.monotonic()
            states = " · ".join(
                f"{ring.name} {'done' if ring.code is not None else ring.progress()}"
                for ring in running
            )
            print(f"rings: {clock(reported - start)}: {states}", flush=True)
    for ring in running:
        if not ring.shown:
            show(ring)
    print(f"\nrings: all ended in {clock(time.monotonic() - start)}", flush=True)
    for ring in running:
        print(f"  {ring.name:<18} exit {ring.code}  {clock(ring.elapsed()):>6}  {ring.summary()}")
    print(critical_path({ring.name: ring.elapsed() for ring in running}), flush=True)
    for ring in running:
        for line in ring.failures():
            print(f"rings: {ring.name}: {line}", flush=True)
    failed = [ring.code for ring in running if ring.code]
    return failed[0] if failed else (130 if stopping else 0)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
