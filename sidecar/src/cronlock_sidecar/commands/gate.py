"""The init container that holds the user's containers back until the sidecar has decided."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from cronlock_sidecar.contract import EXIT_OK, EXIT_SKIPPED, EXIT_UNAVAILABLE
from cronlock_sidecar.pod.rundir import read_decision

log = logging.getLogger("cronlock_sidecar.gate")

# The sidecar decides within a few hundred milliseconds of its start, and every
# millisecond the gate sleeps past the decision delays the work: poll often at first,
# then (a `wait` policy's long wait) ten times a second.
FAST_POLL_SECONDS = 0.005
FAST_POLL_FOR = 2.0
POLL_SECONDS = 0.1
EXIT_CODES = {
    "run": EXIT_OK,
    "overlap": EXIT_OK,
    "skip": EXIT_SKIPPED,
    "unavailable": EXIT_UNAVAILABLE,
}


def gate(
    run_dir: Path,
    timeout: float,
    *,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Exit 0 to run, 75 to skip, 69 when the API was unavailable or no decision came."""
    started = monotonic()
    deadline = started + timeout
    while True:
        decision = read_decision(run_dir)
        if decision is not None:
            return _report(decision, run_dir)
        now = monotonic()
        if now >= deadline:
            log.error(
                "no decision from the cronlock sidecar in %s within %.0fs; not running "
                "(fail closed)",
                run_dir,
                timeout,
            )
            return EXIT_UNAVAILABLE
        sleep(FAST_POLL_SECONDS if now - started < FAST_POLL_FOR else POLL_SECONDS)


def _report(decision: str, run_dir: Path) -> int:
    if decision == "run":
        log.info("lease acquired; starting the run")
    elif decision == "overlap":
        log.warning("another run holds the lease; observe policy: starting the run anyway")
    elif decision == "skip":
        log.info("another run holds the lease; skipping this run")
    elif decision == "unavailable":
        log.error("the sidecar could not reach or was refused by the API server; not running")
    else:
        log.error("unknown decision %r in %s; not running (fail closed)", decision, run_dir)
    return EXIT_CODES.get(decision, EXIT_UNAVAILABLE)
