"""A Redis failover while a run holds its lock: a primary, two replicas, and a relay in
front that is moved to the promoted replica, as Sentinel and a Service would do.

Real redis-server processes. Each replica reaches the primary through a relay of its own,
so the tests can cut replication the way a network does: a stopped relay holds what the
primary sent, and a killed one loses it (a paused replica would still find it in its
socket's buffer). The runs are `cronlock-sidecar run` processes whose work records when
it started and stopped, so an overlap is measured, not assumed. Each case runs ROUNDS
times (CRONLOCK_FAILOVER_ROUNDS, 1 in `make test`); docs/RELIABILITY.md has the figures
of a longer run.

- Without `?replicas=`, a claim no replica got is lost in the failover: a second run
  takes the lock with the same fencing token, and works beside the first until the first
  fails to renew and stops.
- With `?replicas=1`, a claim counts only once a replica has it: the failover (to the
  replica furthest along, as Sentinel picks) keeps it, the second run skips and the first
  goes on; with no replica reachable, no claim counts and no run starts.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.support.paths import ROOT, SIDECAR
from tests.support.ports import free_port
from tests.support.stores import RedisServer

ROUNDS = int(os.environ.get("CRONLOCK_FAILOVER_ROUNDS", "1"))
RELAY = ROOT / "tests" / "controlplane" / "relay.py"
TTL, RENEW = "6s", "1s"


class Relay:
    """A TCP relay on a loopback port of its own to a server's port."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def to(self, server: RedisServer) -> None:
        """Relays to `server` from now on; connections to the one before are cut."""
        self.kill()
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(RELAY), "127.0.0.1", str(self.port), "127.0.0.1",
                 str(server.port)],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 10
        while f":{self.port} ->".encode() not in self.log.read_bytes():
            assert time.monotonic() < deadline, "the relay did not start"
            time.sleep(0.02)

    def url(self, password: str, query: str = "") -> str:
        return f"redis://:{password}@127.0.0.1:{self.port}/0{query}"

    def stall(self) -> None:
        """What the server sends stays in the relay's buffers (a link that stopped)."""
        if self.process is not None:
            self.process.send_signal(signal.SIGSTOP)

    def kill(self) -> None:
        """The link is gone, and what it held with it."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


def client(server: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(server.url, socket_timeout=2)


@dataclass
class Replicated:
    primary: RedisServer
    replicas: list[RedisServer]
    links: list[Relay]  # replica i reaches the primary through links[i]
    front: Relay  # what every run is given

    def wait_replicating(self) -> None:
        deadline = time.monotonic() + 20
        for replica in self.replicas:
            while True:
                with client(replica) as admin:
                    if admin.info("replication").get("master_link_status") == "up":
                        break
                assert time.monotonic() < deadline, "a replica never caught up"
                time.sleep(0.05)

    def cut_replication(self) -> None:
        for link in self.links:
            link.stall()

    def fail_over(self) -> float:
        """The primary dies with its links; the replica furthest along is promoted, the
        other follows it and the front is moved to it, as Sentinel and a Service would.
        Returns when the front reached the new primary (time.time())."""
        self.primary.kill()
        for link in self.links:
            link.kill()
        offsets = []
        for replica in self.replicas:
            with client(replica) as admin:
                offsets.append(int(admin.info("replication")["slave_repl_offset"]))
        chosen = self.replicas[offsets.index(max(offsets))]
        with client(chosen) as admin:
            admin.execute_command("REPLICAOF", "NO", "ONE")
        for replica in self.replicas:
            if replica is not chosen:
                with client(replica) as admin:
                    admin.execute_command("REPLICAOF", "127.0.0.1", str(chosen.port))
        self.front.to(chosen)
        return time.time()


@pytest.fixture
def replicated() -> Iterator[Replicated]:
    top = Path(tempfile.mkdtemp(prefix="cronlock-failover-"))
    servers: list[RedisServer] = []
    relays: list[Relay] = []
    try:
        for name in ("primary", "replica-1", "replica-2"):
            (top / name).mkdir()
            password = servers[0].password if servers else None
            servers.append(RedisServer(top / name, password=password))
        primary, *replicas = servers
        primary.start()
        links = [Relay(top / f"link-{number}.log") for number in (1, 2)]
        front = Relay(top / "front.log")
        relays += [*links, front]
        for link, replica in zip(links, replicas, strict=True):
            link.to(primary)
            replica.replicate(link.port, primary.password)
            replica.start()
        front.to(primary)
        made = Replicated(primary, replicas, links, front)
        made.wait_replicating()
        yield made
    finally:
        for relay in relays:
            relay.kill()
        for server in servers:
            server.stop()
        shutil.rmtree(top, ignore_errors=True)


@dataclass
class Run:
    """A `cronlock-sidecar run` whose work writes its token, start and end times."""

    process: subprocess.Popen[str]
    directory: Path

    def moment(self, name: str) -> float | None:
        path = self.directory / name
        text = path.read_text().strip() if path.exists() else ""
        return float(text) if text else None

    def token(self) -> int:
        return int((self.directory / "token").read_text())

    def wait_started(self, timeout: float = 20) -> float:
        deadline = time.monotonic() + timeout
        while (started := self.moment("start")) is None:
            if self.process.poll() is not None:
                _, err = self.process.communicate()
                raise AssertionError(f"ended {self.process.returncode} before working: {err}")
            assert time.monotonic() < deadline, "the work never started"
            time.sleep(0.02)
        return started

    def finish(self, timeout: float = 30) -> tuple[int, str]:
        _, err = self.process.communicate(timeout=timeout)
        return self.process.returncode, err


def start_run(url: str, lock: str, directory: Path, seconds: float) -> Run:
    directory.mkdir(parents=True)
    mark = f"date +%s.%N > {directory}"
    work = (
        f'echo "$CRONLOCK_FENCING_TOKEN" > {directory}/token; {mark}/start; '
        f'trap "{mark}/end; exit 143" TERM; '
        f"i=0; while [ $i -lt {int(seconds * 10)} ]; do sleep 0.1; i=$((i+1)); done; "
        f"{mark}/end"
    )
    env = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
    process = subprocess.Popen(
        [str(SIDECAR), "run", "--lease", lock, "--ttl", TTL, "--renew", RENEW,
         "--store", url, "--", "sh", "-c", work],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    return Run(process, directory)


def lock_name(case: str, round_: int) -> str:
    return f"tests/failover-{case}-{round_}-{os.getpid()}"


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_a_claim_the_replica_never_got_is_lost_in_a_failover_and_its_token_repeats(
    replicated: Replicated, tmp_path: Path, round_: int
) -> None:
    lock = lock_name("async", round_)
    url = replicated.front.url(replicated.primary.password)
    replicated.cut_replication()  # the claim below reaches the primary only
    first = start_run(url, lock, tmp_path / "first", seconds=20)
    first.wait_started()
    moved = replicated.fail_over()
    second = start_run(url, lock, tmp_path / "second", seconds=3)
    second_started = second.wait_started()
    first_code, first_err = first.finish()
    second_code, second_err = second.finish()
    first_end = first.moment("end")
    assert first_end is not None
    overlap = max(0.0, min(first_end, second.moment("end") or first_end) - second_started)
    print(
        f"failover without replicas=: second run started {second_started - moved:.2f}s "
        f"after the move, overlapped the first for {overlap:.2f}s; tokens "
        f"{first.token()} and {second.token()}; first exited {first_code}"
    )
    assert second_code == 0, second_err
    # The promoted replica never had the claim, nor the fence counter's step for it: the
    # second holder is handed the same token, so fencing cannot tell the two apart.
    assert second.token() == first.token()
    # The first run learns on its next renewal (every 1s) that the lock it held is gone, and
    # its work is stopped: the overlap lasts at most a renew period and the stop.
    assert first_code == 70, first_err
    assert first_end - moved < 3.0, first_err
    assert overlap < 3.0


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_with_replicas_1_a_failover_keeps_the_claim_and_the_second_run_skips(
    replicated: Replicated, tmp_path: Path, round_: int
) -> None:
    lock = lock_name("waited", round_)
    url = replicated.front.url(replicated.primary.password, "?replicas=1")
    first = start_run(url, lock, tmp_path / "first", seconds=8)
    first.wait_started()
    moved = replicated.fail_over()
    second = start_run(url, lock, tmp_path / "second", seconds=1)
    second_code, second_err = second.finish()
    print(f"failover with replicas=1: second run ended {time.time() - moved:.2f}s after the move")
    assert second_code == 75, second_err
    assert second.moment("start") is None
    assert "already running" in second_err
    first_code, first_err = first.finish()
    assert first_code == 0, first_err
    third = start_run(url, lock, tmp_path / "third", seconds=0)
    third_code, third_err = third.finish()
    assert third_code == 0, third_err
    assert third.token() > first.token()


def test_with_replicas_1_and_the_replica_away_no_claim_counts_and_no_run_starts(
    replicated: Replicated, tmp_path: Path
) -> None:
    lock = lock_name("away", 0)
    replicated.cut_replication()
    url = replicated.front.url(replicated.primary.password, "?replicas=1")
    run = start_run(url, lock, tmp_path / "run", seconds=1)
    code, err = run.finish()
    assert code == 69, err
    assert run.moment("start") is None
    assert "reached 0 of the 1 replicas asked for (replicas=1)" in err
