"""The compatibility ring: a slice of the e2e ring on each Kubernetes release the chart admits.

    python -m tests.compat [--write] [VERSION ...]      # make test-compat [KUBERNETES=v1.30.14]

For each release (default: every one in COMPATIBLE_KUBERNETES, tests/controlplane/versions.env)
it builds that release's control plane and node once (tests/controlplane/build with
CRONLOCK_KUBERNETES_VERSION; cached per release), then runs the slice below in one pytest
session on it: the real kube-apiserver, controllers, kubelet, containerd and runc of that
release, the images and chart of this checkout. Prints the table of release x check;
`--write` also puts it in docs/COMPATIBILITY.md, with the commit and the date. The exit
status is 1 when any check failed on any release.

The slice is made of e2e tests named one by one, so nothing is deselected: each check is
shown by the tests listed for it, and fails when any of them fails.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.versions import compatible_releases

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "COMPATIBILITY.md"
BEGIN, END = "<!-- compat-table:begin -->", "<!-- compat-table:end -->"

E2E = "tests/e2e"
HELM_TEST = (
    f"{E2E}/test_chart_on_node.py::"
    "test_the_charts_operator_injects_and_helm_test_passes_then_fails_saying_why_without_it"
)
SLICE: dict[str, tuple[str, ...]] = {
    # One test checks both (one install of the chart).
    "chart install (admission policies), injection, `helm test`": (HELM_TEST,),
    "`helm test` fails and says why": (HELM_TEST,),
    "a run holds, a second skips (exit 75, `FailJob`)": (
        f"{E2E}/test_overlap.py::"
        "test_a_manual_run_during_a_run_is_skipped_and_the_run_after_it_goes_ahead",
    ),
    "a stalled run is stopped before its Lease expires": (
        f"{E2E}/test_failures.py::test_a_frozen_sidecar_gets_its_run_stopped_before_the_lease_expires",
    ),
    "freeze and unfreeze": (
        f"{E2E}/test_freeze_on_node.py::"
        "test_a_frozen_lock_skips_its_runs_at_the_gate_until_it_is_unfrozen",
    ),
    "revert on uninstall": (
        f"{E2E}/test_chart_on_node.py::"
        "test_helm_uninstall_with_revert_runs_its_hook_on_the_node_and_puts_the_cronjob_back",
    ),
}


@dataclass
class Result:
    release: str
    outcomes: dict[str, str]  # test id -> passed | failed | error | not run
    build_s: float
    run_s: float
    note: str = ""

    def check(self, check: str) -> str:
        found = [self.outcomes.get(test, "not run") for test in SLICE[check]]
        return "pass" if all(outcome == "passed" for outcome in found) else "FAIL"

    @property
    def green(self) -> bool:
        return all(self.check(check) == "pass" for check in SLICE)


SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)")


def outcomes_of(log: str) -> dict[str, str]:
    """Test id -> passed, failed, error, ... from the short summary `pytest -rA` prints."""
    found: dict[str, str] = {}
    for line in log.splitlines():
        if match := SUMMARY_LINE.match(line):
            outcome, test_id = match.groups()
            found.setdefault(test_id, outcome.lower())
    return found


def run_release(release: str, logs: Path) -> Result:
    env = dict(os.environ, CRONLOCK_KUBERNETES_VERSION=release)
    logs.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    built = subprocess.run(
        [str(ROOT / "tests" / "controlplane" / "build")],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    build_s = time.monotonic() - start
    if built.returncode != 0:
        return Result(release, {}, build_s, 0.0, f"build failed (exit {built.returncode})")
    tests = sorted({test for tests in SLICE.values() for test in tests})
    start = time.monotonic()
    log_path = logs / f"{release}.log"
    with log_path.open("w") as log:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-rA",
                *tests,
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
        )
    return Result(release, outcomes_of(log_path.read_text()), build_s, time.monotonic() - start)


def table(results: list[Result]) -> str:
    checks = list(SLICE)
    head = "| check | " + " | ".join(result.release for result in results) + " |"
    rule = "|---|" + "---|" * len(results)
    rows = [
        f"| {check} | " + " | ".join(result.check(check) for result in results) + " |"
        for check in checks
    ]
    times = "| build / slice (s) | " + " | ".join(
        f"{result.build_s:.0f} / {result.run_s:.0f}" for result in results
    ) + " |"  # fmt: skip
    notes = [f"- {result.release}: {result.note}" for result in results if result.note]
    return "\n".join([head, rule, *rows, times, *(["", *notes] if notes else [])])


def commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


def write(doc: Path, text: str) -> None:
    """Replaces what lies between the table's markers in the doc."""
    current = doc.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(current):
        raise SystemExit(f"compat: {doc} has no {BEGIN} ... {END} markers")
    doc.write_text(pattern.sub(lambda _: f"{BEGIN}\n{text}\n{END}", current))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.compat", description=__doc__)
    parser.add_argument("releases", nargs="*", help="default: every compatible release")
    parser.add_argument("--write", action="store_true", help=f"put the table in {DOC}")
    args = parser.parse_args(argv)
    known = compatible_releases()
    releases = args.releases or known
    unknown = [release for release in releases if release not in known]
    if unknown:
        parser.error(f"not a release the tests pin: {', '.join(unknown)}; one of {known}")
    logs = ROOT / ".testenv" / "compat"
    results = []
    for release in releases:
        print(f"compat: {release}: building and running the slice (log {logs}/{release}.log)")
        result = run_release(release, logs)
        print(
            f"compat: {release}: {'green' if result.green else 'FAILED'} "
            f"(build {result.build_s:.0f}s, slice {result.run_s:.0f}s) {result.note}",
            flush=True,
        )
        results.append(result)
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    text = f"Measured at {commit()} on {today} (`python -m tests.compat`).\n\n{table(results)}"
    print(text)
    if args.write:
        write(DOC, text)
    return 0 if all(result.green for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
