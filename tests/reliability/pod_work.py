"""What the pod checker runs and counts: its settings, its work unit and its records.

The work unit (`WORK`) is the main container of every pod of a trial. `PodSettings` holds
the timings of the injected CronJob and of a trial. `PodFault`, `Contender` and `PodTrial`
record what a trial did. The fault kinds are named here too.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

import kubernetes
import urllib3

from cronlock_operator.cronjob.config import InvalidConfig
from cronlock_operator.cronjob.timing import kill_grace_seconds, minimum_ttl_seconds
from cronlock_sidecar import contract
from cronlock_sidecar.lock.model import Timing
from tests.reliability.checker import Counts, Fault
from tests.reliability.ha_faults import HA_API_AWAY, HA_FAULTS
from tests.reliability.work_unit import work_script
from tests.support.node import HOST_LINK_IP

NEVER = "0 0 1 1 *"
EVERY_MINUTE = "* * * * *"
# The permits mode's CronJobs after the first (`<first>-b`, ...): their Jobs' and pods'
# names start with the first's name too, which the trial's works are found by.
CRONJOB_SUFFIXES = ("b", "c", "d", "e", "f")
MAX_PERMITS = contract.MAX_PERMITS
MAIN = "main"
POD_USER = 65532
API_ERRORS = (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError)
# Where the trial's shared directory (a hostPath volume) is mounted in the main container.
SHARED = "/checker"
SHARED_VOLUME = "checker"
SHARED_FILES = ("flock", "events.jsonl", "fencing-store")
FENCING_TOKEN = f"{contract.RUN_DIR}/{contract.FENCING_TOKEN_FILE}"

# Faults on the holder's pod, from the host of the node it runs on.
POD_PROCESS_FAULTS = (
    "cut-pods",
    "stop-sidecar",
    "kill-sidecar",
    "kill-main",
    "delete-pod",
    "node-loss",
)
# Faults on the holder's node, as a cluster of many nodes sees them (issue 25): the node
# cut off from the API server with its kubelet alive, its containerd crashed and
# restarted, the holder evicted (Eviction API), preempted by the scheduler for a pod of a
# higher priority, or its node drained, its Node deleted.
NODE_FAULTS = ("partition", "restart-containerd", "evict", "preempt", "drain", "delete-node")
CONTROL_FAULTS = ("pause-apiserver", "kill-operator")
POD_FAULTS = POD_PROCESS_FAULTS + NODE_FAULTS + CONTROL_FAULTS
# On an HA control plane (--ha), its own faults take pause-apiserver's place.
HA_POD_FAULTS = (*POD_PROCESS_FAULTS, *NODE_FAULTS, *HA_FAULTS, "kill-operator")
# While these run the API server may not answer: no Job is created meanwhile.
API_AWAY = frozenset({"pause-apiserver", *HA_API_AWAY})
# These hit a long work, one that would outlive its Lease if nothing stopped it: only then
# does its stop, compared with the Lease's expiry, show that the sidecar stopped it in time.
LONG_WORK_FAULTS = frozenset(
    {"cut-pods", "stop-sidecar", "kill-sidecar", "node-loss", "pause-apiserver", "partition",
     *HA_FAULTS}
)  # fmt: skip

WORK = work_script(
    """
    import fcntl, json, os, socket, sys, time
    shared, token_path, host, port, seconds = sys.argv[1:6]
    lock_path = os.path.join(shared, "flock")
    store_path = os.path.join(shared, "fencing-store")
    pod = os.environ["HOSTNAME"]
    # First the tracker: it sees this work from now until the kernel closes the connection,
    # when this process dies, however it dies.
    tracker = socket.create_connection((host, int(port)), timeout=10)
    tracker.sendall((pod + "\\n").encode())
    token = int(open(token_path).read())
    # A lock of N permits: N from the trial's shared `slots` file (absent: 1), the permit
    # this run holds from tick.env (CRONLOCK_PERMIT, beside the token; its token is that
    # permit's), as a work would read them.
    slots_path = os.path.join(shared, "slots")
    slots = int(open(slots_path).read()) if os.path.exists(slots_path) else 1
    told = os.path.join(os.path.dirname(token_path), "tick.env")
    told = dict(line.strip().partition("=")[::2]
                for line in (open(told).read().splitlines() if os.path.exists(told) else []))
    permit = int(told.get("CRONLOCK_PERMIT") or 0)
    def record(event, **fields):
        line = json.dumps({"event": event, "pod": pod, "token": token, "permit": permit,
                           "mono": time.monotonic(), **fields})
        fd = os.open(os.path.join(shared, "events.jsonl"), os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, (line + "\\n").encode())
        finally:
            os.close(fd)
    """
)
# `sh` stays PID 1 (a command after the work keeps it from exec'ing Python): like most
# shells there, it ignores SIGTERM, so only a SIGKILL ends a work that must stop.
WORK_SCRIPT = f'python3 -c {shlex.quote(WORK)} "$@"; exit $?'


def work_command(tracker_port: int, seconds: float) -> list[str]:
    """The main container's command: WORK under `sh`; the duration is the last argument."""
    return [
        "sh", "-c", WORK_SCRIPT, "work",
        SHARED, FENCING_TOKEN, HOST_LINK_IP, str(tracker_port), f"{seconds:.2f}",
    ]  # fmt: skip


@dataclass(frozen=True)
class PodSettings:
    """Timings of the injected CronJob and the trial; ttl and renew are whole seconds."""

    # The operator's shortest valid ttl with its default clock skew
    # (cronlock_operator.cronjob.timing).
    ttl: int = minimum_ttl_seconds(contract.DEFAULT_SKEW_SECONDS)
    renew: int = 2
    # The operator's default; it is what the injected sidecars use.
    skew: int = contract.DEFAULT_SKEW_SECONDS
    # Pods start in seconds on the node, and a fault may leave no contender waiting.
    slack: float = 8.0
    contenders: int = 3
    runs_per_trial: int = 3
    work: tuple[float, float] = (3.0, 6.0)
    # Beyond the longer ttl + skew by this much: a long work (LONG_WORK_FAULTS).
    long_work: tuple[float, float] = (4.0, 8.0)
    wait_timeout: int = 60
    trial_timeout: float = 240.0
    # How long a restarted operator may take to bring the CronJob to what it asks for.
    settle_timeout: float = 30.0
    # kill-operator: SIGKILL this long (uniform from 0) after the patch that starts a
    # reconcile; the operator re-injects within about 20-25 ms (docs/RELIABILITY.md).
    operator_kill_window: float = 0.03
    # At a trial's end: how long its pods may take to be gone.
    stop_timeout: float = 60.0
    # The permits mode (issue 58): `cronjobs` CronJobs sharing one lock of `permits`
    # permits, on `schedule` (so that scheduled ticks contend with the manual runs).
    permits: int = 1
    cronjobs: int = 1
    schedule: str = NEVER

    def __post_init__(self) -> None:
        if not 1 <= self.permits <= MAX_PERMITS:
            raise ValueError(f"--permits {self.permits}: a lock has 1 to {MAX_PERMITS} permits")
        if not 1 <= self.cronjobs <= len(CRONJOB_SUFFIXES) + 1:
            most = len(CRONJOB_SUFFIXES) + 1
            raise ValueError(f"--cronjobs {self.cronjobs}: 1 to {most} CronJobs share a lock")
        for ttl in self.ttls:
            try:
                kill_grace_seconds(ttl, self.skew, f"{ttl}s")
            except InvalidConfig as error:
                raise ValueError(str(error)) from None

    @property
    def ttls(self) -> tuple[int, int]:
        """kill-operator flips cronlock.io/ttl between these two, forcing a real patch."""
        return self.ttl, self.ttl + 1

    @property
    def renew_deadline(self) -> float:
        """How long a holder goes on without a successful renewal (2/3 of the ttl)."""
        return Timing.of(self.ttl, skew=self.skew).renew_deadline

    @property
    def kill_grace(self) -> int:
        """The pod's grace the operator injects for this ttl."""
        return kill_grace_seconds(self.ttl, self.skew, f"{self.ttl}s")

    @property
    def long_work_seconds(self) -> tuple[float, float]:
        """A long work outlives the longer ttl + skew: its Lease expires before it ends."""
        beyond = max(self.ttls) + self.skew
        return beyond + self.long_work[0], beyond + self.long_work[1]

    @property
    def recovery_bound(self) -> float:
        """Longest a lock may stay unused after a fault: the longer ttl + skew + slack."""
        return max(self.ttls) + self.skew + self.slack


@dataclass
class PodFault(Fault):
    """A checker fault, the work it hit, and what was wrong with the CronJob afterwards."""

    problems: list[str] = field(default_factory=list)
    # kill-operator: the kill landed before the operator's patch was visible (mid-reconcile).
    before_patch: bool = False
    # The pod whose work the fault hit, how its hold on the Lease ended, and its work's
    # stop minus that Lease's expiry (negative: stopped before the Lease expired).
    holder: str = ""
    lease_end: str = ""
    after_expiry: float | None = None

    @property
    def corrupted(self) -> bool:
        return bool(self.problems)


@dataclass
class Contender:
    """One Job made from the trial's CronJob."""

    job: str
    created: float
    long: bool = False
    done: bool = False
    outcome: str = ""


@dataclass
class PodTrial(Counts):
    index: int
    faults: list[PodFault]
    jobs: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    # Jobs that could not be made because the CronJob was not fully injected.
    bad_templates: list[str] = field(default_factory=list)
    # Pairs of works whose lives, as the tracker saw them, intersect.
    tracker_overlaps: int = 0
    # Every work's stop minus the expiry of the Lease its pod held.
    after_expiry: list[float] = field(default_factory=list)
    # Works whose pod was never seen holding the Lease (a work without the lock, or a
    # Lease watch that missed it): nothing to compare their stop with.
    works_without_lease: list[str] = field(default_factory=list)
    # Works still running when the trial had stopped its pods.
    leftover_works: int = 0
    # Per permit: works started, writes refused, overlaps (WorkRecords.permit_counts).
    by_permit: dict[int, dict[str, int]] = field(default_factory=dict)
    # Each permit's highest fencing token on the Lease, and each time one went back.
    tokens: dict[int, int] = field(default_factory=dict)
    token_regressions: list[str] = field(default_factory=list)
    # Scheduled ticks' Jobs (made by the CronJob controller) among the trial's works' pods.
    scheduled_works: int = 0
    # The most works that ran at one moment (pod_checks.most_at_once).
    most_at_once: int = 0
