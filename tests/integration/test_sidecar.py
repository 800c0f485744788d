"""`cronlock-sidecar` run and hold as real processes against a real API server with RBAC."""

from __future__ import annotations

import itertools
import json
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cronlock_sidecar.lock.model import Timing
from tests.support.controlplane import ControlPlane, ServiceAccountKubeconfig
from tests.support.kube import wait_for
from tests.support.paths import SIDECAR
from tests.support.ports import free_port
from tests.support.processes import finish
from tests.support.timing import SLACK, at_once, at_renew_deadline

pytestmark = pytest.mark.controlplane

SKIPPED, UNAVAILABLE, LOST = 75, 69, 70
ACQUIRED = re.compile(r"^(\S+ \S+) cronlock-sidecar INFO lease \S+ acquired by .*$", re.M)
MICROTIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")

# CMD for the "wait" test: holds an exclusive flock for its whole life, so two commands
# running at once cannot go unnoticed, and records its interval and fencing token.
EXCLUSIVE_WORK = textwrap.dedent(
    """
    import fcntl, os, sys, time
    with open(sys.argv[1], "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            with open(sys.argv[2], "a") as log:
                log.write("overlap\\n")
            sys.exit(1)
        start = time.time()
        time.sleep(float(sys.argv[3]))
        end = time.time()
        with open(sys.argv[2], "a") as log:
            log.write(f"{os.environ['CRONLOCK_FENCING_TOKEN']} {start} {end}\\n")
    """
)

# CMD that reports its pid, then records when SIGTERM reached it (or ignores SIGTERM).
SIGNALLED_WORK = textwrap.dedent(
    """
    import os, signal, sys, time
    started, signalled, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    def on_term(signum, frame):
        with open(signalled, "w") as out:
            out.write(f"{time.time()}\\n")
        sys.exit(143)
    signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "ignore" else on_term)
    with open(started, "w") as out:
        out.write(f"{os.getpid()}\\n")
    time.sleep(120)
    """
)


def sidecar(
    controlplane: ControlPlane, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(SIDECAR), *args],
        env={**controlplane.env, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def holder_column(controlplane: ControlPlane, namespace: str, name: str) -> str:
    """The HOLDER column of `kubectl get lease`, as a user would look at it ("" when free)."""
    header, row = controlplane.kubectl("get", "lease", name, "-n", namespace).strip().splitlines()
    start = header.index("HOLDER")
    end = header.index("AGE")
    return row[start:end].strip()


def microtime(text: str) -> datetime:
    assert MICROTIME.match(text), text
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def held_status(port: int) -> int | None:
    """/held's HTTP status, or None while nothing listens yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/held", timeout=2) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def pid_alive(pid: int) -> bool:
    """Running, not a zombie waiting for an adoptive parent to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] not in {"Z", "X"}


def read_when_written(path: Path, timeout: float = 20) -> str:
    return wait_for(lambda: path.exists() and path.read_text().strip(), timeout, f"{path.name}")


# --- run: one holder among many ----------------------------------------------------------
def test_of_many_concurrent_contenders_exactly_one_runs_and_the_others_skip(
    controlplane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    cleanup: list[subprocess.Popen[str]],
) -> None:
    ran, finished = tmp_path / "ran", tmp_path / "finished"
    # The winner keeps working until every loser has decided, however slowly they started.
    work = (
        f'echo "$CRONLOCK_FENCING_TOKEN" >> {ran}; i=0; '
        f"while [ ! -e {finished} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"
    )
    lease = f"{namespace}/cronlock-x"
    contenders = [
        sidecar(controlplane, "run", "--lease", lease, "--ttl", "10s", "--", "sh", "-c", work)
        for _ in range(12)
    ]
    cleanup.extend(contenders)

    def decided() -> bool:
        runs = len(ran.read_text().splitlines()) if ran.exists() else 0
        return runs + sum(process.poll() is not None for process in contenders) >= 12

    wait_for(decided, timeout=60, what="all 12 contenders to skip or run")
    holder = holder_column(controlplane, namespace, "cronlock-x")
    finished.touch()
    results = [finish(process) for process in contenders]

    codes = sorted(code for code, _ in results)
    assert codes == [0] + [SKIPPED] * 11
    assert ran.read_text().splitlines() == ["1"]
    skip_line = re.compile(
        rf"already running: lease {re.escape(lease)} held by {re.escape(holder)} "
        r"\(renewed \d+s ago, expires in \d+s\); skipping this run$"
    )
    for code, stderr in results:
        if code == SKIPPED:
            lines = [line for line in stderr.splitlines() if "already running" in line]
            assert len(lines) == 1, stderr
            assert skip_line.search(lines[0]), lines[0]
    assert holder_column(controlplane, namespace, "cronlock-x") == ""


@pytest.mark.timeout(90)
def test_waiting_contenders_run_one_after_another_without_overlap(
    controlplane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    cleanup: list[subprocess.Popen[str]],
) -> None:
    lock, log = tmp_path / "flock", tmp_path / "intervals"
    lease = f"{namespace}/cronlock-queue"
    contenders = [
        sidecar(
            controlplane,
            "run",
            "--lease",
            lease,
            "--ttl",
            "10s",
            "--policy",
            "wait",
            "--wait-timeout",
            "30s",
            "--",
            sys.executable,
            "-c",
            EXCLUSIVE_WORK,
            str(lock),
            str(log),
            "1",
        )
        for _ in range(4)
    ]
    cleanup.extend(contenders)

    results = [finish(process, timeout=60) for process in contenders]

    assert [code for code, _ in results] == [0, 0, 0, 0], [stderr for _, stderr in results]
    lines = log.read_text().splitlines()
    assert "overlap" not in lines
    intervals = sorted(
        (float(start), float(end), int(token)) for token, start, end in map(str.split, lines)
    )
    assert len(intervals) == 4
    for (_, end, token), (start, _, next_token) in itertools.pairwise(intervals):
        assert end <= start, intervals
        # Each holder got a newer fencing token than the one before it.
        assert token < next_token, intervals
    assert controlplane.lease_json(namespace, "cronlock-queue")["spec"]["leaseTransitions"] == 4


# --- run: release and loss ---------------------------------------------------------------
RUN_TTL = 30
# A ttl of 3 x SLACK leaves the slack between the renew deadline (4s) and the ttl.
RUN_TIMING = Timing.of(6, 1)


def test_sigterm_to_run_reaches_the_command_and_releases_the_lease_at_once(
    controlplane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    cleanup: list[subprocess.Popen[str]],
) -> None:
    started, signalled = tmp_path / "started", tmp_path / "signalled"
    run = sidecar(
        controlplane,
        "run",
        "--lease",
        f"{namespace}/cronlock-term",
        "--ttl",
        f"{RUN_TTL}s",
        "--identity",
        "term-test_0001",
        "--",
        sys.executable,
        "-c",
        SIGNALLED_WORK,
        str(started),
        str(signalled),
        "handle",
    )
    cleanup.append(run)
    read_when_written(started)
    before = controlplane.lease_json(namespace, "cronlock-term")
    assert before["spec"]["holderIdentity"] == "term-test_0001"

    sent = time.monotonic()
    run.send_signal(signal.SIGTERM)
    code, stderr = finish(run, timeout=10)
    took = time.monotonic() - sent

    assert code == 143, stderr  # CMD's own status: it handled SIGTERM
    assert signalled.exists()
    at_once(
        "SIGTERM",
        "run forwarded it, CMD ended and run released the Lease",
        instead_of=RUN_TTL,
        alternative="the Lease left to expire",
    ).check(took)
    # Right away: `run` has exited, so the release already happened.
    assert holder_column(controlplane, namespace, "cronlock-term") == ""
    after = controlplane.lease_json(namespace, "cronlock-term")
    annotations = after["metadata"]["annotations"]
    assert annotations["cronlock.io/last-holder"] == "term-test_0001"
    assert microtime(annotations["cronlock.io/released-at"]) >= microtime(
        before["spec"]["renewTime"]
    )
    assert after["spec"]["leaseTransitions"] == before["spec"]["leaseTransitions"] == 1
    assert "holderIdentity" not in after["spec"]


@pytest.mark.timeout(60)
def test_after_sigkill_of_run_the_watchdog_stops_the_command_and_others_wait_for_the_ttl(
    controlplane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    cleanup: list[subprocess.Popen[str]],
) -> None:
    ttl, skew = 4.0, 2.0
    lease = f"{namespace}/cronlock-crash"
    started, signalled = tmp_path / "started", tmp_path / "signalled"
    # CMD ignores SIGTERM, so the parent-death signal alone cannot stop it: only the
    # watchdog's SIGKILL after the kill grace can.
    run = sidecar(
        controlplane,
        "run",
        "--lease",
        lease,
        "--ttl",
        f"{ttl:g}s",
        "--skew",
        f"{skew:g}s",
        "--",
        sys.executable,
        "-c",
        SIGNALLED_WORK,
        str(started),
        str(signalled),
        "ignore",
    )
    cleanup.append(run)
    command_pid = int(read_when_written(started))

    run.kill()
    run.wait()
    killed = time.monotonic()
    renewed = microtime(controlplane.lease_json(namespace, "cronlock-crash")["spec"]["renewTime"])

    def contend(*policy: str) -> subprocess.Popen[str]:
        return sidecar(controlplane, "run", "--lease", lease, "--skew", f"{skew:g}s", *policy,
                       "--", "true")  # fmt: skip

    right_after = finish(contend())
    # A contender that waits from now takes the lock only once the hold expired: its own
    # decision, logged, whatever the machine's load did to its start-up.
    waiter = contend("--policy", "wait", "--wait-timeout", "30s")
    wait_for(lambda: not pid_alive(command_pid), timeout=10, what="the watchdog to stop CMD")
    command_stopped = time.monotonic() - killed
    expires = renewed.timestamp() + ttl + skew
    waited = finish(waiter, timeout=60)

    assert right_after[0] == SKIPPED, right_after[1]
    assert command_stopped < ttl, f"CMD outlived its holder by {command_stopped:.1f}s"
    assert waited[0] == 0, waited[1]
    taken = ACQUIRED.search(waited[1])
    assert taken is not None, waited[1]
    assert "expired" in taken.group(0), waited[1]
    # The log's time is the local wall clock, the Lease's renew time the API server's: one
    # host's clock. Taken after the ttl and the skew, and not long after (a retry each second).
    taken_at = datetime.strptime(taken.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    assert expires <= taken_at < expires + 1.0 + SLACK, (taken_at - expires, waited[1])
    assert controlplane.lease_json(namespace, "cronlock-crash")["spec"]["leaseTransitions"] == 2


@pytest.mark.timeout(60)
def test_with_the_api_server_paused_the_command_is_stopped_before_the_ttl_and_run_exits_70(
    controlplane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    cleanup: list[subprocess.Popen[str]],
) -> None:
    ttl = RUN_TIMING.ttl
    started, signalled = tmp_path / "started", tmp_path / "signalled"
    run = sidecar(
        controlplane,
        "run",
        "--lease",
        f"{namespace}/cronlock-pause",
        "--ttl",
        f"{RUN_TIMING.ttl:g}s",
        "--renew",
        f"{RUN_TIMING.renew:g}s",
        "--log-level",
        "debug",
        "--log-format",
        "json",
        "--",
        sys.executable,
        "-c",
        SIGNALLED_WORK,
        str(started),
        str(signalled),
        "handle",
    )
    cleanup.append(run)
    read_when_written(started)

    def renewed_once() -> datetime | None:
        spec = controlplane.lease_json(namespace, "cronlock-pause")["spec"]
        return microtime(spec["renewTime"]) if spec["renewTime"] != spec["acquireTime"] else None

    wait_for(renewed_once, timeout=10, what="a first renew")
    controlplane.pause("kube-apiserver")
    try:
        stopped = float(read_when_written(signalled, timeout=ttl + 2))
        code, stderr = finish(run, timeout=15)
    finally:
        controlplane.resume("kube-apiserver")
    wait_for(
        lambda: controlplane.kubectl("get", "--raw", "/readyz", check=False).strip() == "ok",
        timeout=30,
        what="the API server to answer again",
    )

    # The last renewal `run` saw succeed, logged as its answer came (wall clock, as CMD's
    # `stopped`): its deadline is the one `run` keeps. Not the Lease read after the resume:
    # a renewal `run` sent into the paused API server may still be stored then.
    last_renewal = max(
        datetime.fromisoformat(record["timestamp"]).timestamp()
        for record in map(json.loads, stderr.splitlines())
        if " renewed by " in record["message"]
    )
    at_renew_deadline(
        RUN_TIMING, "run stops CMD (SIGTERM)", since="the last renewal run logged"
    ).check(stopped - last_renewal)
    assert code == LOST, stderr
    assert "lost" in stderr


# --- RBAC ----------------------------------------------------------------------------------
def test_a_role_for_one_lease_name_is_enough_to_run_and_refuses_another_lease_with_69(
    controlplane: ControlPlane,
    namespace: str,
    service_account_kubeconfig: ServiceAccountKubeconfig,
) -> None:
    for name in ("cronlock-mine", "cronlock-other"):
        controlplane.kubectl(
            "create",
            "-n",
            namespace,
            "-f",
            "-",
            input_text=json.dumps(
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": name},
                    "spec": {},
                }
            ),
        )
    controlplane.kubectl(
        "create",
        "role",
        "lock-mine",
        "-n",
        namespace,
        "--verb=get,update,patch",
        "--resource=leases.coordination.k8s.io",
        "--resource-name=cronlock-mine",
    )
    controlplane.kubectl(
        "create",
        "rolebinding",
        "lock-mine",
        "-n",
        namespace,
        "--role=lock-mine",
        f"--serviceaccount={namespace}:locker",
    )
    kubeconfig = service_account_kubeconfig(namespace, "locker")
    account = f"system:serviceaccount:{namespace}:locker"
    wait_for(
        lambda: controlplane.kubectl(
            "auth",
            "can-i",
            "update",
            "leases/cronlock-mine",
            "-n",
            namespace,
            "--as",
            account,
            check=False,
        ).startswith("yes"),
        timeout=10,
        what="the Role to take effect",
    )
    as_locker = {"KUBECONFIG": str(kubeconfig)}

    mine = sidecar(
        controlplane,
        "run",
        "--lease",
        f"{namespace}/cronlock-mine",
        "--",
        "echo",
        "ran",
        env=as_locker,
    )
    mine_out, mine_err = mine.communicate(timeout=30)
    other = sidecar(
        controlplane,
        "run",
        "--lease",
        f"{namespace}/cronlock-other",
        "--",
        "echo",
        "ran",
        env=as_locker,
    )
    other_out, other_err = other.communicate(timeout=30)

    assert mine.returncode == 0, mine_err
    assert mine_out == "ran\n"
    assert controlplane.lease_json(namespace, "cronlock-mine")["spec"]["leaseTransitions"] == 1
    assert holder_column(controlplane, namespace, "cronlock-mine") == ""
    assert other.returncode == UNAVAILABLE, other_err
    assert other_out == ""
    assert f"forbidden: cannot get lease {namespace}/cronlock-other" in other_err
    assert "holderIdentity" not in controlplane.lease_json(namespace, "cronlock-other")["spec"]


# --- hold and gate -----------------------------------------------------------------------
HOLD_TTL = 6


def hold(
    controlplane: ControlPlane,
    lease: str,
    run_dir: Path,
    port: int,
    pod: str,
    uid: str,
) -> subprocess.Popen[str]:
    return sidecar(
        controlplane,
        "hold",
        "--lease",
        lease,
        "--ttl",
        f"{HOLD_TTL}s",
        "--run-dir",
        str(run_dir),
        "--port",
        str(port),
        env={"CRONLOCK_POD_NAME": pod, "CRONLOCK_POD_UID": uid},
    )


def gate(controlplane: ControlPlane, run_dir: Path) -> int:
    result = subprocess.run(
        [str(SIDECAR), "gate", "--run-dir", str(run_dir)],
        env=controlplane.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return result.returncode


def test_hold_decides_run_serves_held_writes_the_fencing_token_and_releases_on_sigterm(
    controlplane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    cleanup: list[subprocess.Popen[str]],
) -> None:
    port = free_port()
    sidecar_process = hold(
        controlplane,
        f"{namespace}/cronlock-hold",
        tmp_path,
        port,
        "report-2912-abcde",
        "0f1e2d3c-4b5a",
    )
    cleanup.append(sidecar_process)

    decision = read_when_written(tmp_path / "decision")
    lease = controlplane.lease_json(namespace, "cronlock-hold")

    assert decision == "run"
    assert wait_for(lambda: held_status(port), timeout=10, what="/held") == 200
    assert gate(controlplane, tmp_path) == 0
    assert lease["spec"]["holderIdentity"] == "report-2912-abcde_0f1e2d3c"
    assert (tmp_path / "fencing-token").read_text() == f"{lease['spec']['leaseTransitions']}\n"
    assert (
        json.loads((tmp_path / "lease.json").read_text())["holder"] == "report-2912-abcde_0f1e2d3c"
    )

    sent = time.monotonic()
    sidecar_process.send_signal(signal.SIGTERM)
    code, stderr = finish(sidecar_process, timeout=10)

    assert code == 0, stderr
    at_once(
        "SIGTERM",
        "hold released the Lease and exited",
        instead_of=HOLD_TTL,
        alternative="the Lease left to expire",
    ).check(time.monotonic() - sent)
    assert holder_column(controlplane, namespace, "cronlock-hold") == ""
    released = controlplane.lease_json(namespace, "cronlock-hold")
    assert released["metadata"]["annotations"]["cronlock.io/last-holder"] == (
        "report-2912-abcde_0f1e2d3c"
    )
    assert released["spec"]["leaseTransitions"] == lease["spec"]["leaseTransitions"]


def test_a_second_hold_skips_while_the_first_holds_and_never_releases_its_lease(
    controlplane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    cleanup: list[subprocess.Popen[str]],
) -> None:
    lease = f"{namespace}/cronlock-shared"
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first_port, second_port = free_port(), free_port()
    first = hold(controlplane, lease, first_dir, first_port, "shared-1-aaaaa", "11111111-aaaa")
    cleanup.append(first)
    assert read_when_written(first_dir / "decision") == "run"

    second = hold(controlplane, lease, second_dir, second_port, "shared-2-bbbbb", "22222222-bbbb")
    cleanup.append(second)

    assert read_when_written(second_dir / "decision") == "skip"
    assert wait_for(lambda: held_status(second_port), timeout=10, what="/held") == 503
    assert held_status(first_port) == 200
    assert gate(controlplane, second_dir) == SKIPPED
    assert not (second_dir / "fencing-token").exists()

    second.send_signal(signal.SIGTERM)
    code, stderr = finish(second, timeout=10)

    assert code == 0, stderr
    assert "already running: lease" in stderr
    # The skipped sidecar's SIGTERM must not free the Lease the first one holds.
    assert holder_column(controlplane, namespace, "cronlock-shared") == "shared-1-aaaaa_11111111"


def test_a_restarted_hold_with_the_same_identity_resumes_without_a_new_transition(
    controlplane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    cleanup: list[subprocess.Popen[str]],
) -> None:
    lease = f"{namespace}/cronlock-resume"
    port = free_port()
    crashed = hold(controlplane, lease, tmp_path, port, "resume-1-ccccc", "33333333-cccc")
    cleanup.append(crashed)
    assert read_when_written(tmp_path / "decision") == "run"
    before = controlplane.lease_json(namespace, "cronlock-resume")["spec"]
    crashed.kill()  # a container crash: no release
    crashed.wait()

    restarted = hold(controlplane, lease, tmp_path, port, "resume-1-ccccc", "33333333-cccc")
    cleanup.append(restarted)

    assert wait_for(lambda: held_status(port) == 200, timeout=10, what="/held 200 after restart")
    after = wait_for(
        lambda: (
            spec
            if (spec := controlplane.lease_json(namespace, "cronlock-resume")["spec"])["renewTime"]
            != before["renewTime"]
            else None
        ),
        timeout=10,
        what="the restarted sidecar to renew",
    )
    assert after["holderIdentity"] == before["holderIdentity"] == "resume-1-ccccc_33333333"
    assert after["leaseTransitions"] == before["leaseTransitions"]
    assert after["acquireTime"] == before["acquireTime"]
    assert (tmp_path / "fencing-token").read_text() == f"{before['leaseTransitions']}\n"
    restarted.send_signal(signal.SIGTERM)
    code, stderr = finish(restarted, timeout=10)
    assert code == 0, stderr
    assert "resumed" in stderr
    assert holder_column(controlplane, namespace, "cronlock-resume") == ""


# --- run: the replace and observe policies ------------------------------------------------
# CMD for the policy tests: takes an exclusive flock (a failed one is an overlap), logs
# "started ID", and "stopped ID" when SIGTERM reaches it or "finished ID" at its end.
POLICY_WORK = textwrap.dedent(
    """
    import fcntl, signal, sys, time
    lock_path, log_path, name, seconds = sys.argv[1:5]
    def log(what):
        with open(log_path, "a") as out:
            out.write(f"{what} {name} {time.monotonic()}\\n")
    lock = open(lock_path, "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log("overlap")
    def on_term(signum, frame):
        log("stopped")
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    log("started")
    time.sleep(float(seconds))
    log("finished")
    """
)


def policy_contender(
    controlplane: ControlPlane, lease: str, policy: str, name: str, tmp_path: Path, seconds: float
) -> subprocess.Popen[str]:
    return sidecar(
        controlplane,
        "run", "--lease", lease, "--ttl", "6s", "--renew", "1s", "--policy", policy,
        "--identity", name, "--",
        sys.executable, "-c", POLICY_WORK,
        str(tmp_path / "flock"), str(tmp_path / "log"), name, f"{seconds:g}",
    )  # fmt: skip


def policy_log(tmp_path: Path) -> list[tuple[str, str, float]]:
    if not (tmp_path / "log").exists():
        return []
    return [
        (what, name, float(at))
        for what, name, at in map(str.split, (tmp_path / "log").read_text().splitlines())
    ]


def test_replace_contenders_stop_each_holder_first_and_the_newest_ends_up_holding(
    controlplane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    cleanup: list[subprocess.Popen[str]],
) -> None:
    lease = f"{namespace}/cronlock-prices"
    names = ["first", "second", "third"]
    contenders = []
    for name in names:
        contenders.append(policy_contender(controlplane, lease, "replace", name, tmp_path, 30))
        cleanup.append(contenders[-1])
        wait_for(
            lambda name=name: ("started", name) in [(w, n) for w, n, _ in policy_log(tmp_path)],
            30,
            f"{name}'s work to start",
        )

    assert holder_column(controlplane, namespace, "cronlock-prices") == "third"
    results = [finish(process) for process in contenders[:2]]
    for (code, stderr), newer in zip(results, names[1:], strict=True):
        assert code == LOST, stderr
        assert f"replaced by {newer}; stopping this run" in stderr
    third = contenders[2]
    third.send_signal(signal.SIGTERM)
    finish(third)
    events = policy_log(tmp_path)
    assert [what for what, _, _ in events if what == "overlap"] == []
    order = [(what, name) for what, name, _ in events]
    assert order == [
        ("started", "first"),
        ("stopped", "first"),
        ("started", "second"),
        ("stopped", "second"),
        ("started", "third"),
        ("stopped", "third"),
    ]
    released = controlplane.lease_json(namespace, "cronlock-prices")["metadata"]["annotations"]
    assert released["cronlock.io/replaced-by"] == "third"
    assert released["cronlock.io/last-holder"] == "third"


def test_observe_contenders_all_run_and_every_overlap_is_logged_and_noted(
    controlplane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    cleanup: list[subprocess.Popen[str]],
) -> None:
    lease = f"{namespace}/cronlock-export"
    first = policy_contender(controlplane, lease, "observe", "first", tmp_path, 8)
    cleanup.append(first)
    wait_for(lambda: (tmp_path / "log").exists(), 30, "the first work to start")
    others = [
        policy_contender(controlplane, lease, "observe", name, tmp_path, 1)
        for name in ("second", "third")
    ]
    cleanup.extend(others)
    results = [finish(process) for process in [*others, first]]

    assert [code for code, _ in results] == [0, 0, 0], [stderr for _, stderr in results]
    for code_and_log in results[:2]:
        assert (
            code_and_log[1].count(
                f"overlap: lease {lease} held by first (observe policy: running anyway)"
            )
            == 1
        )
    assert "overlap:" not in results[2][1]
    events = policy_log(tmp_path)
    assert sorted(name for what, name, _ in events if what == "finished") == [
        "first",
        "second",
        "third",
    ]
    assert sorted(name for what, name, _ in events if what == "overlap") == ["second", "third"]
    noted = controlplane.lease_json(namespace, "cronlock-export")["metadata"]["annotations"]
    assert noted["cronlock.io/overlap"] in ("second", "third")
    assert noted["cronlock.io/last-holder"] == "first"  # only the first held it


# --- each tick at most once (lock/ticks.py) ------------------------------------------------
def tick_hold(
    controlplane: ControlPlane, lease: str, run_dir: Path, pod: str, job: str, job_uid: str
) -> subprocess.Popen[str]:
    """`hold` as the operator injects it into a pod of Job `job` of the CronJob `report`."""
    return sidecar(
        controlplane,
        "hold",
        "--lease",
        lease,
        "--ttl",
        f"{HOLD_TTL}s",
        "--run-dir",
        str(run_dir),
        "--port",
        str(free_port()),
        env={
            "CRONLOCK_POD_NAME": pod,
            "CRONLOCK_POD_UID": f"{job_uid[:4]}{pod[-4:]}-uid",
            "CRONLOCK_JOB_NAME": job,
            "CRONLOCK_CRONJOB": "report",
            "CRONLOCK_JOB_UID": job_uid,
            "CRONLOCK_CLUSTER": "east",
        },
    )


def test_a_second_job_of_a_tick_already_worked_skips_with_75_and_says_so(
    controlplane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    cleanup: list[subprocess.Popen[str]],
) -> None:
    lease = f"{namespace}/cronlock-ticks"
    minutes = int(time.time()) // 60
    job = f"report-{minutes}"
    tick = datetime.fromtimestamp(minutes * 60, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    first_dir, retry_dir, second_dir = tmp_path / "first", tmp_path / "retry", tmp_path / "second"

    # The tick's Job runs, and its work reads the tick; then it ends and releases.
    first = tick_hold(controlplane, lease, first_dir, f"{job}-aaaaa", job, "uid-first-job")
    cleanup.append(first)
    assert read_when_written(first_dir / "decision") == "run"
    assert (first_dir / "tick.env").read_text() == (
        f"CRONLOCK_TICK={tick}\nCRONLOCK_PREVIOUS_TICK=\nCRONLOCK_LAST_SUCCESS_TICK=\n"
        "CRONLOCK_MANUAL=false\nCRONLOCK_SUCCESS_FILE=\nCRONLOCK_PERMIT=0\n"
    )
    first.send_signal(signal.SIGTERM)
    assert finish(first, timeout=10)[0] == 0
    assert holder_column(controlplane, namespace, "cronlock-ticks") == ""

    # Another Job named as the same tick (deleted and made again, or another cluster's
    # controller on a shared lock): the lock is free, and still the run skips.
    second = tick_hold(controlplane, lease, second_dir, f"{job}-bbbbb", job, "uid-second-job")
    cleanup.append(second)
    assert read_when_written(second_dir / "decision") == "already-ran"
    termination = tmp_path / "termination-log"
    result = subprocess.run(
        [str(SIDECAR), "gate", "--run-dir", str(second_dir), "--termination-log", str(termination)],
        env=controlplane.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == SKIPPED, result.stderr
    line = termination.read_text().strip()
    assert line == (
        f"already ran: tick {tick} of report on lock {lease} was claimed by job {job} "
        f"(run uid-first-job, holder {job}-aaaaa_uid-aaaa, cluster east) for tick {tick}; "
        "skipping this run"
    )
    assert line in result.stderr
    assert not (second_dir / "tick.env").exists()
    second.send_signal(signal.SIGTERM)
    code, stderr = finish(second, timeout=10)
    assert code == 0
    assert line in stderr
    assert holder_column(controlplane, namespace, "cronlock-ticks") == ""

    # The first Job's retry pod is the same run: it goes on, and its work reads the same
    # tick, the one recorded before its claim being its own Job's.
    retry = tick_hold(controlplane, lease, retry_dir, f"{job}-ccccc", job, "uid-first-job")
    cleanup.append(retry)
    assert read_when_written(retry_dir / "decision") == "run"
    assert (retry_dir / "tick.env").read_text().startswith(f"CRONLOCK_TICK={tick}\n")
    record = controlplane.lease_json(namespace, "cronlock-ticks")["metadata"]["annotations"][
        "cronlock.io/tick.report"
    ]
    assert record == f"{tick} {job} uid-first-job {job}-ccccc_uid-cccc east"
