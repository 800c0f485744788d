"""Real Redis and PostgreSQL servers for the tests, on loopback, each in a directory of its own.

The Debian packages (redis-server, postgresql) are installed by tests/controlplane/
host-packages. PostgreSQL refuses to run as root, so it runs as the `postgres` user the
package creates. A server can be paused (SIGSTOP, as a hung host), killed and restarted
on the same port and data, which the store tests and the checker use as faults.
"""

from __future__ import annotations

import abc
import glob
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psycopg
import redis

from tests.support.papers import marked_block
from tests.support.paths import ROOT
from tests.support.ports import free_port

STORES_MD = ROOT / "docs" / "STORES.md"


def documented(marker: str) -> str:
    """The fenced block after `<!-- tested: MARKER -->` in docs/STORES.md."""
    return marked_block(STORES_MD, marker)


def _children(pid: int) -> list[int]:
    found = []
    for path in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(path).read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(path.split("/")[2]))
    return found


def _signal(pids: list[int], signum: signal.Signals) -> None:
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signum)


class _Server(abc.ABC):
    """What both servers share: a process tree to pause, kill and start again."""

    process: subprocess.Popen[bytes] | None = None

    @abc.abstractmethod
    def _start(self) -> None:
        """Start the server process (not waiting for it to answer)."""

    @abc.abstractmethod
    def ready(self) -> bool:
        """Whether it answers a client now."""

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("not started")
        return self.process.pid

    def tree(self) -> list[int]:
        """The server's process and all below it (runuser → postmaster → its backends)."""
        pids, frontier = [self.pid], [self.pid]
        while frontier:
            frontier = [child for pid in frontier for child in _children(pid)]
            pids += frontier
        return pids

    def wait_ready(self, timeout: float = 30.0, check: Callable[[], bool] | None = None) -> float:
        """When it answered `check` (by default a client's request)."""
        answers = self.ready if check is None else check
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if answers():
                return time.monotonic()
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{type(self).__name__} exited with {self.process.returncode}")
            time.sleep(0.05)
        raise TimeoutError(f"{type(self).__name__} not ready after {timeout}s")

    def start(self) -> None:
        self._start()
        self.wait_ready()

    def pause(self) -> None:
        _signal(self.tree(), signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None and self.process.poll() is None:
            _signal(self.tree(), signal.SIGCONT)

    def kill(self) -> None:
        if self.process is None:
            return
        tree = self.tree()
        _signal(tree, signal.SIGKILL)
        self.process.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{pid}").exists() for pid in tree[1:]):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)

    def restart(self) -> float:
        """Killed, then started again on the same port and data; when it answered again."""
        self.kill()
        self._start()
        return self.wait_ready()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.resume()
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


class RedisServer(_Server):
    """redis-server with a password; every write is on disk before it is answered."""

    def __init__(
        self,
        directory: Path,
        also_on: str | Sequence[str] | None = None,
        *,
        password: str | None = None,
    ) -> None:
        """`also_on`: the addresses it listens on besides loopback (the host's end of a
        node's link, where pods reach it)."""
        self.directory = directory
        self.port = free_port()
        self.password = password or secrets.token_hex(12)
        self.url = self.url_at("127.0.0.1")
        self.binds = ["127.0.0.1", *addresses(also_on)]
        self.primary: tuple[int, str] | None = None

    def replicate(self, port: int, password: str) -> None:
        """From its start on: a replica of the primary at 127.0.0.1:`port`."""
        self.primary = (port, password)

    def url_at(self, host: str) -> str:
        return f"redis://:{self.password}@{host}:{self.port}/0"

    def _start(self) -> None:
        argv = [
            shutil.which("redis-server") or "/usr/bin/redis-server",
            "--bind", " ".join(self.binds), "--port", str(self.port),
            "--requirepass", self.password,
            "--dir", str(self.directory), "--save", "", "--appendonly", "yes",
            "--appendfsync", "always", "--daemonize", "no", "--logfile", "redis.log",
        ]  # fmt: skip
        if self.primary is not None:
            port, password = self.primary
            argv += ["--replicaof", "127.0.0.1", str(port), "--masterauth", password]
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL)

    def ready(self) -> bool:
        try:
            with redis.Redis.from_url(self.url, socket_timeout=0.5) as client:
                return bool(client.ping())
        except redis.RedisError:
            return False


class PostgresServer(_Server):
    """PostgreSQL with a `cronlock` role and database, password (scram) auth on loopback
    and on the addresses `also_on` (the host's end of a node's link, where pods reach it)."""

    BIN = Path("/usr/lib/postgresql/15/bin")

    def __init__(self, directory: Path, also_on: str | Sequence[str] | None = None) -> None:
        self.directory = directory
        self.listen = ",".join(["127.0.0.1", *addresses(also_on)])
        self.data = directory / "data"
        self.port = free_port()
        self.password = secrets.token_hex(12)
        self.url = f"postgresql://cronlock:{self.password}@127.0.0.1:{self.port}/cronlock"
        shutil.chown(directory, "postgres")
        directory.chmod(0o700)
        password_file = directory / "pw"
        password_file.write_text("unused-superuser-" + secrets.token_hex(8) + "\n")
        shutil.chown(password_file, "postgres")
        self._as_postgres(
            [str(self.BIN / "initdb"), "-D", str(self.data), "-U", "postgres",
             "--auth-local=trust", "--auth-host=scram-sha-256",
             f"--pwfile={password_file}"]
        )  # fmt: skip
        if also_on:
            # Pods connect from their nodes' pod ranges: a password is what lets them in,
            # on the addresses it listens on (no other network reaches those).
            with (self.data / "pg_hba.conf").open("a") as rules:
                rules.write("host all all 0.0.0.0/0 scram-sha-256\n")
        self._start()
        self.wait_ready(check=self._superuser_ready)
        self._as_postgres(
            ["psql", "-h", str(directory), "-p", str(self.port), "-U", "postgres", "-qc",
             f"CREATE ROLE cronlock LOGIN PASSWORD '{self.password}'"]
        )  # fmt: skip
        self._as_postgres(
            ["psql", "-h", str(directory), "-p", str(self.port), "-U", "postgres", "-qc",
             "CREATE DATABASE cronlock OWNER cronlock"]
        )  # fmt: skip

    def superuser(self, database: str = "postgres") -> psycopg.Connection[Any]:
        """A superuser's autocommit connection to `database`, over the Unix socket."""
        return psycopg.connect(
            host=str(self.directory), port=self.port, user="postgres", dbname=database,
            autocommit=True,
        )  # fmt: skip

    def url_at(self, host: str) -> str:
        return f"postgresql://cronlock:{self.password}@{host}:{self.port}/cronlock"

    def url_of(self, user: str, password: str, database: str) -> str:
        """The URL a role logs in with over loopback (password auth)."""
        return f"postgresql://{user}:{password}@127.0.0.1:{self.port}/{database}"

    @staticmethod
    def _as_postgres(argv: list[str]) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *argv],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def _start(self) -> None:
        argv = [
            "runuser", "-u", "postgres", "--", str(self.BIN / "postgres"), "-D", str(self.data),
            "-p", str(self.port), "-k", str(self.directory),
            "-c", f"listen_addresses={self.listen}", "-c", "fsync=on",
        ]  # fmt: skip
        log = open(self.directory.parent / "postgres.log", "ab")  # noqa: SIM115 - the child's
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()

    def _superuser_ready(self) -> bool:
        return (self.directory / f".s.PGSQL.{self.port}").exists() and (
                subprocess.run(
                    ["runuser", "-u", "postgres", "--", "psql", "-h", str(self.directory),
                     "-p", str(self.port), "-U", "postgres", "-qAtc", "SELECT 1"],
                    capture_output=True, timeout=10, check=False,
                ).returncode == 0
            )  # fmt: skip

    def ready(self) -> bool:
        try:
            with psycopg.connect(self.url, connect_timeout=2) as connection:
                connection.execute("SELECT 1")
                return True
        except psycopg.Error:
            return False


def addresses(also_on: str | Sequence[str] | None) -> list[str]:
    if also_on is None:
        return []
    return [also_on] if isinstance(also_on, str) else list(also_on)


@contextmanager
def running(
    kind: str, also_on: str | Sequence[str] | None = None
) -> Iterator[RedisServer | PostgresServer]:
    """A started server of `kind` ("redis" or "postgres"), stopped and removed afterwards;
    it listens `also_on` those addresses too."""
    top = Path(tempfile.mkdtemp(prefix=f"cronlock-{kind}-"))
    top.chmod(0o755)
    directory = top / "server"
    directory.mkdir()
    server: RedisServer | PostgresServer
    if kind == "redis":
        server = RedisServer(directory, also_on)
    else:
        server = PostgresServer(directory, also_on)
    try:
        if kind == "redis":
            server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(top, ignore_errors=True)
