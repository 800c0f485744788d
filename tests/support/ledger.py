"""Which tick each run's work worked, as the work itself says: the ledger of the tick tests.

Each run's work sends one line to a TCP server on the host (busybox `nc`, the way the work
tracker of tests/support/node.py is reached) before it works: its Job's name, the tick in
its /var/run/cronlock/tick.env (`-` while nothing writes one), its cluster and its pod. The
test reads the ledger, not the pods: a pod deleted with its skipped Job, or a cluster's API
server stopped, leaves the ledger whole. The tick a line counts for is the one its Job's
name gives (`<cronjob>-<minutes since the epoch>`, the CronJob controller's, the same in
every cluster); a tick.env that names another is a line of its own in `disagreements`.
"""

from __future__ import annotations

import datetime
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tests.support.contract import GATE_CONTAINER
from tests.support.kube import wait_for
from tests.support.node import exit_code

# Where the work reads its tick (docs/USAGE.md), as a user's script would name it.
TICK_FILE = "/var/run/cronlock/tick.env"
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


@dataclass(frozen=True)
class Entry:
    """One run's line: what its work said, and when the ledger heard it (wall clock)."""

    job: str
    tick_file: str  # CRONLOCK_TICK from the tick file, "-" when empty or absent
    cluster: str
    pod: str
    heard: float

    def tick(self, cronjob: str) -> datetime.datetime | None:
        """The tick of the Job (None for a Job of another CronJob or a manual run)."""
        minutes = self.job.removeprefix(cronjob + "-")
        if not self.job.startswith(cronjob + "-") or not minutes.isdigit():
            return None
        return EPOCH + datetime.timedelta(minutes=int(minutes))


class TickLedger:
    """A TCP server, on one port of each address given (the hosts' ends of the nodes'
    links), that keeps every line a work sends it."""

    def __init__(self, addresses: Sequence[str]) -> None:
        self._servers: list[socket.socket] = []
        self.port = 0
        for _ in range(20):  # the same free port on every address
            first = socket.create_server((addresses[0], 0))
            self.port = int(first.getsockname()[1])
            try:
                others = [socket.create_server((address, self.port)) for address in addresses[1:]]
            except OSError:
                first.close()
                continue
            self._servers = [first, *others]
            break
        if not self._servers:
            raise RuntimeError(f"no port free on all of {addresses}")
        self._lock = threading.Lock()
        self._entries: list[Entry] = []
        self._threads = [
            threading.Thread(target=self._accept, args=(server,), daemon=True)
            for server in self._servers
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        for server in self._servers:
            server.close()

    def script(self, address: str, cluster: str, work: str) -> str:
        """A container's `sh -c` script: tell the ledger at `address` what this run works,
        then do `work`. The Job's name comes from env JOB_NAME (`job_name_env`)."""
        return (
            f'tick=$( [ -r {TICK_FILE} ] && . {TICK_FILE}; echo "$CRONLOCK_TICK" ); '
            f'echo "$JOB_NAME ${{tick:--}} {cluster} $HOSTNAME" | nc -w 10 {address} {self.port}'
            f" && {work}"
        )

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._entries)

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=self._read, args=(connection,), daemon=True).start()

    def _read(self, connection: socket.socket) -> None:
        with connection:
            connection.settimeout(10)
            line = b""
            try:
                while not line.endswith(b"\n"):
                    chunk = connection.recv(256)
                    if not chunk:
                        break
                    line += chunk
            except OSError:
                pass
            text = line.decode(errors="replace").strip()
            fields = text.split()
            if len(fields) == 4:
                job, tick_file, cluster, pod = fields
                entry = Entry(job, tick_file, cluster, pod, time.time())
            else:  # kept whole, so a malformed line shows in the counts, not nowhere
                entry = Entry(text, "-", "?", "?", time.time())
            with self._lock:
                self._entries.append(entry)


def job_name_env() -> dict[str, object]:
    """The main container's env JOB_NAME: its Job's name, from the pod's label."""
    return {
        "name": "JOB_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/job-name']"}},
    }


@dataclass(frozen=True)
class Tally:
    """Of the ticks asked about: how many works each had, which twice, which none."""

    works: dict[datetime.datetime, list[Entry]]

    @property
    def twice(self) -> list[datetime.datetime]:
        return [tick for tick, entries in self.works.items() if len(entries) > 1]

    @property
    def lost(self) -> list[datetime.datetime]:
        return [tick for tick, entries in self.works.items() if not entries]

    def by_cluster(self) -> Counter[str]:
        return Counter(entry.cluster for entries in self.works.values() for entry in entries)

    def describe(self) -> str:
        return "\n".join(
            f"{tick:%H:%M} "
            + (", ".join(f"{e.cluster} ({e.pod}, tick file {e.tick_file})" for e in entries) or "-")
            for tick, entries in sorted(self.works.items())
        )


def tally(entries: Iterable[Entry], cronjob: str, ticks: Iterable[datetime.datetime]) -> Tally:
    """The works of `cronjob` at each of `ticks` (lines of other ticks are left out)."""
    works: dict[datetime.datetime, list[Entry]] = {tick: [] for tick in ticks}
    for entry in entries:
        tick = entry.tick(cronjob)
        if tick in works:
            works[tick].append(entry)
    return Tally(works)


def disagreements(entries: Iterable[Entry], cronjob: str) -> list[Entry]:
    """Lines whose tick file names a tick other than their Job's (an empty one is none)."""
    found = []
    for entry in entries:
        tick = entry.tick(cronjob)
        stamp = None if tick is None else tick.strftime("%Y-%m-%dT%H:%M:%SZ")
        if stamp is not None and entry.tick_file not in ("-", stamp):
            found.append(entry)
    return found


def undecided(pods_of: Callable[[str], list[dict[str, Any]]], jobs: Iterable[str]) -> list[str]:
    """Those of `jobs` whose run (its latest pod, as `pods_of` gives a Job's pods) has not
    yet decided (no pod, or its gate still running) or went ahead and still works (its
    ledger line may not be in yet): what a fixed wait after a tick stood in for."""
    pending = []
    for job in jobs:
        pods = pods_of(job)
        gate = exit_code(pods[-1], GATE_CONTAINER) if pods else None
        if gate is None:
            pending.append(f"{job}: {'gate running' if pods else 'no pod yet'}")
        elif gate == 0 and exit_code(pods[-1], "main") is None:
            pending.append(f"{job}: working")
    return pending


def settle(
    pods_of: Callable[[str], list[dict[str, Any]]], jobs: Sequence[str], timeout: float
) -> None:
    """Wait until the run of every one of `jobs` has decided, and worked if it went ahead;
    fail naming those that had not by `timeout`."""
    pending: list[str] = []

    def decided() -> bool:
        nonlocal pending
        pending = undecided(pods_of, jobs)
        return not pending

    try:
        wait_for(decided, timeout, "every run of the ticks to decide", every=1)
    except AssertionError as error:
        raise AssertionError(f"{error}; still undecided: {pending}") from None
