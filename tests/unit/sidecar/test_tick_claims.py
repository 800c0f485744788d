"""Each tick at most once on a Lease: the claim's record, the skip of a tick already worked
by another run under every policy, and what the pod's work and gate get."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cronlock_sidecar.cli import main
from cronlock_sidecar.commands.hold import Holder, pod_tick
from cronlock_sidecar.contract import EXIT_SKIPPED
from cronlock_sidecar.holding.lease import Acquired, Busy, LeaseKeeper
from cronlock_sidecar.holding.policy import acquire
from cronlock_sidecar.lock.model import Timing, read_lease
from cronlock_sidecar.lock.ticks import Tick, TickRecord, read_record, read_success, record_key
from cronlock_sidecar.options import ConfigError, parse_options
from cronlock_sidecar.pod.state import SidecarState
from tests.support.leases import make_lease
from tests.unit.sidecar.fakes import LEASE, START, FakeClock, FakeTransport, wait_for

ME = "report-29001-x7k2p_3f2a9c1e"
OTHER = "report-29001-q8m3z_9a8b7c6d"
MINUTES = int(START.timestamp()) // 60
JOB = f"report-{MINUTES}"
TICK = Tick("report", START, JOB, "uid-of-this-job")
EARLIER = START - timedelta(minutes=5)


def recorded(at: datetime, run: str, *, job: str = "", holder: str = OTHER) -> dict[str, str]:
    """The annotation a claim of tick `at` by run `run` leaves on the Lease."""
    record = TickRecord("report", at, job or f"report-{int(at.timestamp()) // 60}", run, holder, "")
    return {record_key("report"): record.text()}


def keeper(
    clock: FakeClock, transport: FakeTransport, tick: Tick | None = TICK, identity: str = ME
) -> LeaseKeeper:
    return LeaseKeeper(
        transport, LEASE, identity, Timing.of(60, 20, 2), clock, JOB, tick=tick, cluster="east"
    )


def record_on(transport: FakeTransport) -> TickRecord | None:
    assert transport.lease is not None
    return read_record(transport.lease["metadata"].get("annotations") or {}, "report")


def test_a_claim_records_its_tick_job_run_holder_and_cluster(
    clock: FakeClock, transport: FakeTransport
) -> None:
    transport.store(make_lease(annotations=recorded(EARLIER, "uid-of-an-earlier-job")))
    mine = keeper(clock, transport)
    assert isinstance(mine.try_acquire(), Acquired)
    assert record_on(transport) == TickRecord("report", START, JOB, "uid-of-this-job", ME, "east")
    previous = mine.previous_tick
    assert previous is not None
    assert previous.at == EARLIER


def test_a_new_lease_is_created_with_the_record(clock: FakeClock, transport: FakeTransport) -> None:
    mine = keeper(clock, transport)
    assert isinstance(mine.try_acquire(), Acquired)
    assert record_on(transport) == TickRecord("report", START, JOB, "uid-of-this-job", ME, "east")
    assert mine.previous_tick is None


def test_another_job_of_a_claimed_tick_skips_with_the_already_ran_line(
    clock: FakeClock, transport: FakeTransport
) -> None:
    transport.store(make_lease(annotations=recorded(START, "uid-of-the-first-job")))
    result = keeper(clock, transport).try_acquire()
    assert isinstance(result, Busy)
    assert result.why == "already ran"
    assert result.message() == (
        f"already ran: tick 2026-11-29T08:00:00Z of report on lock default/cronlock-report was "
        f"claimed by job {JOB} (run uid-of-the-first-job, holder {OTHER}) for tick "
        "2026-11-29T08:00:00Z; skipping this run"
    )
    assert transport.writes() == []


def test_a_later_tick_on_record_makes_an_earlier_tick_skip(
    clock: FakeClock, transport: FakeTransport
) -> None:
    transport.store(make_lease(annotations=recorded(START + timedelta(minutes=1), "uid-later")))
    clock.advance(61)  # the later tick is due by now: it is believed
    result = keeper(clock, transport).try_acquire()
    assert isinstance(result, Busy)
    assert result.why == "already ran"


def test_the_retry_pod_of_the_same_job_goes_on(clock: FakeClock, transport: FakeTransport) -> None:
    # The Job's first pod claimed and failed; its retry pod is the same run (the Job's uid).
    transport.store(
        make_lease(annotations=recorded(START, "uid-of-this-job", job=JOB, holder=OTHER))
    )
    assert isinstance(keeper(clock, transport).try_acquire(), Acquired)
    assert record_on(transport) == TickRecord("report", START, JOB, "uid-of-this-job", ME, "east")


def test_a_manual_run_has_no_tick_and_keeps_todays_rules(
    clock: FakeClock, transport: FakeTransport
) -> None:
    transport.store(make_lease(annotations=recorded(START, "uid-of-the-first-job")))
    assert isinstance(keeper(clock, transport, tick=None).try_acquire(), Acquired)
    # The record is the scheduled runs': a manual run leaves it as it was.
    record = record_on(transport)
    assert record is not None
    assert record.run == "uid-of-the-first-job"


def test_a_future_record_is_nobodys_tick_yet_and_is_ignored(
    clock: FakeClock, transport: FakeTransport
) -> None:
    far = START + timedelta(days=3650)
    transport.store(make_lease(annotations=recorded(far, "uid-of-a-hostile-pod")))
    mine = keeper(clock, transport)
    assert isinstance(mine.try_acquire(), Acquired)
    assert record_on(transport) == TickRecord("report", START, JOB, "uid-of-this-job", ME, "east")
    assert mine.previous_tick is None


@pytest.mark.parametrize("policy", ["skip", "wait", "replace", "observe"])
@pytest.mark.parametrize("held", [True, False])
def test_already_ran_ends_every_policy_at_once(
    clock: FakeClock, transport: FakeTransport, policy: str, held: bool
) -> None:
    annotations = recorded(START, "uid-of-the-first-job")
    transport.store(make_lease(OTHER if held else "", annotations=annotations))
    waited: list[float] = []
    result = acquire(
        keeper(clock, transport),
        policy=policy,
        wait_timeout=600,
        pause=lambda seconds: waited.append(seconds) or False,
    )
    assert isinstance(result, Busy)
    assert result.why == "already ran"
    assert waited == [], "a tick that already ran is not waited for"
    # Neither replaced (no yield-to note) nor observed (no overlap note): nothing written.
    assert transport.writes() == []
    assert read_lease(transport.lease or {}).holder == (OTHER if held else "")


def test_the_pods_tick_is_its_jobs_and_a_manual_jobs_is_none() -> None:
    def options(job: str) -> list[str]:
        return ["hold", "--lease", "default/cronlock-report", "--identity", ME, "--job-name", job]

    env = {"CRONLOCK_CRONJOB": "report", "CRONLOCK_JOB_UID": "uid-1", "CRONLOCK_CLUSTER": "east"}
    scheduled = parse_options(options(JOB), env)
    assert (scheduled.cronjob, scheduled.job_uid, scheduled.cluster) == ("report", "uid-1", "east")
    assert pod_tick(scheduled) == Tick("report", START, JOB, "uid-1")
    assert pod_tick(parse_options(options("report-manual-x1"), env)) is None
    assert pod_tick(parse_options(options(JOB), {})) is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CRONLOCK_CRONJOB": "Report"}, "--cronjob (from CRONLOCK_CRONJOB): 'Report' is not"),
        ({"CRONLOCK_CRONJOB": "report"}, "--job-uid: required: Job report-"),
        (
            {"CRONLOCK_CRONJOB": "report", "CRONLOCK_JOB_UID": "a b"},
            "--job-uid (from CRONLOCK_JOB_UID): 'a b' is not valid",
        ),
    ],
)
def test_bad_tick_settings_are_refused_with_what_to_do(env: dict[str, str], message: str) -> None:
    args = ["hold", "--lease", "default/cronlock-report", "--identity", ME, "--job-name", JOB]
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_options(args, env)


# --- the pod: hold's decision, tick.env, the gate ----------------------------------------
class Pod:
    """`hold` in-process over the fake transport, and the run dir it shares with the gate."""

    def __init__(
        self,
        tmp_path: Path,
        clock: FakeClock,
        transport: FakeTransport,
        job: str,
        policy: str = "skip",
        *,
        store: bool = False,
        mounted: bool = True,
        extra: tuple[str, ...] = (),
    ):
        self.run_dir = tmp_path / "run"
        # The success volume as the operator mounts it for a lock in a store.
        self.success_file = tmp_path / "success" / "succeeded"
        if mounted:
            self.success_file.parent.mkdir(exist_ok=True)
        options = parse_options(
            [
                "hold", "--lease", "default/cronlock-report", "--identity", ME,
                "--ttl", "3s", "--renew", "200ms", "--run-dir", str(self.run_dir),
                "--job-name", job, "--cronjob", "report", "--job-uid", "uid-of-this-job",
                "--policy", policy, *extra,
            ],
            {"CRONLOCK_STORE": "redis://127.0.0.1:6379/0"} if store else {},
        )  # fmt: skip
        self.stop = threading.Event()
        self.holder = Holder(
            options,
            transport,
            clock,
            SidecarState(),
            self.stop,
            success_file=self.success_file,
        )
        self.codes: list[int] = []
        self.thread = threading.Thread(target=lambda: self.codes.append(self.holder.run()))
        self.thread.start()
        wait_for(lambda: (self.run_dir / "decision").exists())

    def file(self, name: str) -> str:
        return (self.run_dir / name).read_text()

    def end(self) -> None:
        self.stop.set()
        self.thread.join(10)
        assert self.codes == [0]


@pytest.fixture
def pods(tmp_path: Path, clock: FakeClock, transport: FakeTransport) -> Iterator[list[Pod]]:
    made: list[Pod] = []
    yield made
    for pod in made:
        if pod.thread.is_alive():
            pod.end()


def test_the_work_gets_its_tick_and_the_one_before_in_tick_env(
    tmp_path: Path, clock: FakeClock, transport: FakeTransport, pods: list[Pod]
) -> None:
    transport.store(make_lease(annotations=recorded(EARLIER, "uid-of-an-earlier-job")))
    pods.append(Pod(tmp_path, clock, transport, JOB))
    assert pods[0].file("decision") == "run\n"
    assert pods[0].file("tick.env") == (
        "CRONLOCK_TICK=2026-11-29T08:00:00Z\n"
        "CRONLOCK_PREVIOUS_TICK=2026-11-29T07:55:00Z\n"
        "CRONLOCK_LAST_SUCCESS_TICK=\n"
        "CRONLOCK_MANUAL=false\n"
        "CRONLOCK_SUCCESS_FILE=\n"
        "CRONLOCK_PERMIT=0\n"
    )
    assert main(["gate"], {"CRONLOCK_RUN_DIR": str(pods[0].run_dir)}) == 0


def test_a_pod_holding_permit_1_is_told_its_permit_and_that_permits_token(
    tmp_path: Path, clock: FakeClock, transport: FakeTransport, pods: list[Pod]
) -> None:
    # A lock of two permits: permit 0 (the spec) held by another run, permit 1 taken 4 times.
    entry = f"- {START.strftime('%Y-%m-%dT%H:%M:%S.%fZ')} - 60 4 -"
    notes = {"cronlock.io/permits": "2", "cronlock.io/permit.1": entry}
    transport.store(make_lease(OTHER, annotations=notes))
    pods.append(Pod(tmp_path, clock, transport, JOB))
    assert pods[0].file("decision") == "run\n"
    assert "CRONLOCK_PERMIT=1\n" in pods[0].file("tick.env")
    assert pods[0].file("fencing-token") == "5\n"
    assert '"permit": 1' in pods[0].file("lease.json")
    assert read_lease(transport.lease or {}).holder == OTHER
    assert main(["gate"], {"CRONLOCK_RUN_DIR": str(pods[0].run_dir)}) == 0


def test_a_manual_runs_tick_env_says_manual(
    tmp_path: Path, clock: FakeClock, transport: FakeTransport, pods: list[Pod]
) -> None:
    transport.store(make_lease(annotations=recorded(EARLIER, "uid-of-an-earlier-job")))
    pods.append(Pod(tmp_path, clock, transport, "report-manual-x1"))
    assert pods[0].file("decision") == "run\n"
    assert pods[0].file("tick.env") == (
        "CRONLOCK_TICK=\nCRONLOCK_PREVIOUS_TICK=\nCRONLOCK_LAST_SUCCESS_TICK=\nCRONLOCK_MANUAL=true\n"
        "CRONLOCK_SUCCESS_FILE=\nCRONLOCK_PERMIT=0\n"
    )


def test_the_gate_of_a_tick_that_already_ran_exits_75_with_the_line_as_its_message(
    tmp_path: Path, clock: FakeClock, transport: FakeTransport, pods: list[Pod]
) -> None:
    transport.store(make_lease(annotations=recorded(START, "uid-of-the-first-job")))
    pods.append(Pod(tmp_path, clock, transport, JOB))
    assert pods[0].file("decision") == "already-ran\n"
    assert not (pods[0].run_dir / "tick.env").exists(), "no work starts: it gets no tick"
    termination = tmp_path / "termination-log"
    env = {"CRONLOCK_RUN_DIR": str(pods[0].run_dir), "CRONLOCK_TERMINATION_LOG": str(termination)}
    assert main(["gate"], env) == EXIT_SKIPPED
    line = termination.read_text()
    assert line.startswith("already ran: tick 2026-11-29T08:00:00Z of report on lock ")
    assert "run uid-of-the-first-job" in line
    # The flag's way too, through the full option parser.
    other = tmp_path / "other-log"
    code = main(["gate", "--run-dir", str(pods[0].run_dir), "--termination-log", str(other)], {})
    assert code == EXIT_SKIPPED
    assert other.read_text() == line


def test_a_ticks_record_is_not_rewritten_by_renewals_or_the_release(
    clock: FakeClock, transport: FakeTransport
) -> None:
    transport.store(make_lease())
    mine = keeper(clock, transport)
    assert isinstance(mine.try_acquire(), Acquired)
    claimed = record_on(transport)
    clock.advance(20)
    mine.renew()
    assert record_on(transport) == claimed
    assert mine.release()
    assert record_on(transport) == claimed
    assert read_lease(transport.lease or {}).holder == ""


def test_the_tick_of_a_job_is_minutes_since_the_epoch() -> None:
    # What the tests above build on: START is a whole minute.
    assert datetime.fromtimestamp(MINUTES * 60, UTC) == START


@pytest.mark.parametrize("policy", ["observe", "replace", "wait"])
def test_a_pod_of_any_policy_decides_already_ran_while_the_tick_is_held_by_its_first_job(
    tmp_path: Path, clock: FakeClock, transport: FakeTransport, pods: list[Pod], policy: str
) -> None:
    # The first Job of the tick still works: observe would run anyway, replace would ask
    # it to yield, wait would wait; a second Job of the same tick does none of these.
    transport.store(make_lease(OTHER, annotations=recorded(START, "uid-of-the-first-job")))
    pods.append(Pod(tmp_path, clock, transport, JOB, policy))
    assert pods[0].file("decision") == "already-ran\n"
    assert pods[0].file("skip-line").startswith("already ran: tick 2026-11-29T08:00:00Z")
    assert transport.writes() == [], "no overlap noted, no yield asked"
    assert read_lease(transport.lease or {}).holder == OTHER


def succeeded(at: datetime, run: str) -> dict[str, str]:
    """The success record of tick `at` worked by run `run`."""
    record = TickRecord("report", at, f"report-{int(at.timestamp()) // 60}", run, OTHER, "")
    return {"cronlock.io/succeeded.report": record.text()}


def success_on(transport: FakeTransport) -> TickRecord | None:
    assert transport.lease is not None
    return read_success(transport.lease["metadata"].get("annotations") or {}, "report")


def test_the_work_gets_the_last_successful_tick_apart_from_the_last_claimed(
    tmp_path: Path, clock: FakeClock, transport: FakeTransport, pods: list[Pod]
) -> None:
    # 07:55 was claimed (and failed); 07:50 is the last tick whose work succeeded.
    ten_before = START - timedelta(minutes=10)
    notes = {**recorded(EARLIER, "uid-of-a-failed-job"), **succeeded(ten_before, "uid-ok")}
    transport.store(make_lease(annotations=notes))
    pods.append(Pod(tmp_path, clock, transport, JOB))
    assert pods[0].file("tick.env") == (
        "CRONLOCK_TICK=2026-11-29T08:00:00Z\n"
        "CRONLOCK_PREVIOUS_TICK=2026-11-29T07:55:00Z\n"
        "CRONLOCK_LAST_SUCCESS_TICK=2026-11-29T07:50:00Z\n"
        "CRONLOCK_MANUAL=false\n"
        "CRONLOCK_SUCCESS_FILE=\n"
        "CRONLOCK_PERMIT=0\n"
    )


def test_a_far_future_success_record_is_none_for_the_work(
    clock: FakeClock, transport: FakeTransport
) -> None:
    transport.store(make_lease(annotations=succeeded(START + timedelta(days=400), "evil")))
    mine = keeper(clock, transport)
    assert isinstance(mine.try_acquire(), Acquired)
    assert mine.last_success is None


def test_a_release_records_the_success_only_when_told_the_work_succeeded(
    clock: FakeClock, transport: FakeTransport
) -> None:
    transport.store(make_lease(annotations=succeeded(EARLIER, "uid-ok")))
    failing = keeper(clock, transport)
    assert isinstance(failing.try_acquire(), Acquired)
    assert failing.release()
    recorded_success = success_on(transport)
    assert recorded_success is not None
    assert recorded_success.at == EARLIER, "a release not told of success moves nothing"
    clock.advance(60)
    retry = keeper(clock, transport, identity=OTHER)
    assert isinstance(retry.try_acquire(), Acquired)  # the same run (Job uid): goes on
    assert retry.release(succeeded=True)
    assert success_on(transport) == TickRecord(
        "report", START, JOB, "uid-of-this-job", OTHER, "east"
    )


def test_a_manual_run_records_no_success(clock: FakeClock, transport: FakeTransport) -> None:
    transport.store(make_lease(annotations=succeeded(EARLIER, "uid-ok")))
    manual = keeper(clock, transport, tick=None)
    assert isinstance(manual.try_acquire(), Acquired)
    assert manual.last_success is None, "a manual run is told none: it is no tick's"
    assert manual.release(succeeded=True)
    recorded_success = success_on(transport)
    assert recorded_success is not None
    assert recorded_success.at == EARLIER


# --- a lock in a store: the work says its tick succeeded ----------------------------------
def test_a_store_locks_work_that_creates_the_success_file_has_its_tick_recorded_as_success(
    tmp_path: Path, clock: FakeClock, transport: FakeTransport, pods: list[Pod]
) -> None:
    # The pod's sidecar does not learn its work's exit code: on a store lock the work
    # creates CRONLOCK_SUCCESS_FILE, and the release records the tick's success.
    transport.store(make_lease())
    pod = Pod(tmp_path, clock, transport, JOB, store=True)
    pods.append(pod)
    assert f"CRONLOCK_SUCCESS_FILE={pod.success_file}\n" in pod.file("tick.env")
    pod.success_file.touch()
    pod.end()
    success = success_on(transport)
    assert success is not None
    assert (success.at, success.job, success.run, success.holder) == (
        START,
        JOB,
        "uid-of-this-job",
        ME,
    )
    assert read_lease(transport.lease or {}).holder == ""


def test_a_store_locks_work_that_creates_no_success_file_records_no_success(
    tmp_path: Path, clock: FakeClock, transport: FakeTransport, pods: list[Pod]
) -> None:
    transport.store(make_lease(annotations=succeeded(EARLIER, "uid-ok")))
    pod = Pod(tmp_path, clock, transport, JOB, store=True)
    pods.append(pod)
    pod.end()
    success = success_on(transport)
    assert success is not None
    assert success.at == EARLIER, "a tick whose work said nothing does not move the success"
    assert read_lease(transport.lease or {}).holder == "", "released all the same"


def test_a_store_locks_run_stopped_at_its_max_hold_records_no_success(
    tmp_path: Path, clock: FakeClock, transport: FakeTransport, pods: list[Pod]
) -> None:
    """A work that said it succeeded and then hung past its bound was stopped: no success."""
    transport.store(make_lease(annotations=succeeded(EARLIER, "uid-ok")))
    message = tmp_path / "termination-log"
    bound = ("--max-hold", "1s", "--termination-log", str(message))
    pod = Pod(tmp_path, clock, transport, JOB, store=True, extra=bound)
    pods.append(pod)
    pod.success_file.touch()
    clock.advance(1.1)  # past the bound, within the renew deadline
    wait_for(lambda: message.exists() and message.read_text() != "")
    pod.end()
    success = success_on(transport)
    assert success is not None
    assert success.at == EARLIER
    assert read_lease(transport.lease or {}).holder == "", "released all the same"


def test_a_success_file_that_is_a_link_or_a_directory_records_no_success(
    tmp_path: Path, clock: FakeClock, transport: FakeTransport, pods: list[Pod]
) -> None:
    # Nothing the work leaves there is opened or followed: only a regular file counts.
    transport.store(make_lease())
    pod = Pod(tmp_path, clock, transport, JOB, store=True)
    pods.append(pod)
    target = tmp_path / "elsewhere"
    target.touch()
    pod.success_file.symlink_to(target)
    pod.end()
    assert success_on(transport) is None
    assert read_lease(transport.lease or {}).holder == ""


@pytest.mark.parametrize(
    ("store", "job", "mounted"),
    [
        (False, JOB, True),  # a Lease: the operator records success when the Job completes
        (True, "report-manual-x1", True),  # a manual run: no tick, no success
        (True, JOB, False),  # no success volume (injected by an older operator)
    ],
)
def test_where_the_work_cannot_say_success_tick_env_names_no_file_and_none_is_recorded(
    tmp_path: Path,
    clock: FakeClock,
    transport: FakeTransport,
    pods: list[Pod],
    store: bool,
    job: str,
    mounted: bool,
) -> None:
    transport.store(make_lease())
    pod = Pod(tmp_path, clock, transport, job, store=store, mounted=mounted)
    pods.append(pod)
    assert "CRONLOCK_SUCCESS_FILE=\n" in pod.file("tick.env")
    if mounted:
        pod.success_file.touch()
    pod.end()
    assert success_on(transport) is None
