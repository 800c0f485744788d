"""A separate process stops the guarded work when the lease holder stops vouching for it."""

from __future__ import annotations

import enum
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NoReturn

from cronlock_sidecar.pod.processes import (
    PROC,
    kill_at_once,
    stop_group,
    terminate_then_kill,
    visible_pids,
)

log = logging.getLogger("cronlock_sidecar.watchdog")

# How long `hold` waits for its dismissed watchdog to exit: it exits on `done` at once, and
# the sidecar's exit must never wait on it.
REAP_TIMEOUT = 0.2


class Watchdog:
    """The holder's side of the pipe: what to guard, until when, and when to stand down."""

    def __init__(self, pid: int, write_fd: int, work: str = "CMD") -> None:
        self.pid = pid
        self.work = work
        self._fd: int | None = write_fd
        self._exit_code: int | None = None
        # The renew thread sends heartbeats while the main thread may be finishing.
        self._lock = threading.Lock()

    def _send(self, line: str, *, after_done: bool = True) -> bool:
        """False when the watchdog cannot hear it; `after_done` answers once we said done."""
        with self._lock:
            if self._fd is None:
                return after_done
            try:
                os.write(self._fd, line.encode() + b"\n")
            except BrokenPipeError:
                return False
            except BlockingIOError:
                # 64 KiB of unread heartbeats: the watchdog is stuck, so it cannot act either.
                log.error("the watchdog process %d does not read its pipe", self.pid)
                return False
            return True

    def _gone(self) -> None:
        log.error("the watchdog process %d is gone; it no longer guards %s", self.pid, self.work)

    def guard(self, pgid: int) -> None:
        if not self._send(f"pgid {pgid}"):
            self._gone()

    def announce_self(self) -> None:
        """In the work's own process, between fork and exec (a `preexec_fn`, after its new
        session made its pid its group): tell the watchdog which group to guard.

        The parent says so too once the spawn returns, but a parent frozen or killed in
        between would leave the work running unwatched past its Lease: the work announces
        itself, so the watchdog is armed before the work's first instruction. The pipe's
        write end closes at exec (os.pipe's ends are not inheritable), so the work can
        never write to the watchdog itself.
        """
        if self._fd is not None:
            os.write(self._fd, f"pgid {os.getpid()}\n".encode())

    def valid_until(self, deadline: float) -> None:
        """Heartbeat: the work may go on until this monotonic time without a further heartbeat."""
        if not self._send(f"until {deadline:.6f}"):
            self._gone()

    def stop_run(self) -> bool:
        """The lease is lost: the watchdog stops the work now; False if it cannot any more."""
        return self._send("stop", after_done=False)

    def dismiss(self) -> None:
        """The work is over: the watchdog exits without stopping anything (it may be gone)."""
        self._send("done")
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def reap(self, timeout: float) -> int | None:
        """The watchdog's exit code once it has exited, waiting at most `timeout`; else None."""
        deadline = time.monotonic() + timeout
        while self._exit_code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._exit_code = os.waitstatus_to_exitcode(status)
            elif time.monotonic() >= deadline:
                return None
            else:
                time.sleep(0.01)
        return self._exit_code

    def finish(self) -> int:
        """CMD has ended: let the watchdog exit (it may have exited already) and reap it."""
        self.dismiss()
        if self._exit_code is None:
            _, status = os.waitpid(self.pid, 0)
            self._exit_code = os.waitstatus_to_exitcode(status)
        return self._exit_code


def start(valid_until: float, grace: float) -> Watchdog:
    """Fork the watchdog of `run` before CMD exists, so CMD never runs unwatched."""

    def body(read_fd: int) -> int:
        return watch(read_fd, valid_until, grace)

    # The handlers inherited from `run` would forward signals to a CMD we do not have.
    return _fork(body, "CMD", default=(signal.SIGTERM, signal.SIGHUP), ignore=(signal.SIGINT,))


def start_for_pod(valid_until: float, grace: float, proc_root: Path = PROC) -> Watchdog:
    """Fork the watchdog of `hold` before the gate lets the run start, so it never runs unwatched.

    It guards every process of the pod's shared PID namespace but itself, the sidecar and
    PID 1. Only `done`, `stop`, the pipe's end or SIGKILL end it: the user's processes run
    as the sidecar's UID under `stop: signal` and may signal everything they see (`kill -1`),
    and the pod's SIGTERM is the sidecar's alone, which dismisses the watchdog itself.
    """
    sidecar_pid = os.getpid()

    def body(read_fd: int) -> int:
        return watch_pod(read_fd, valid_until, grace, sidecar_pid, proc_root)

    ignored = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    return _fork(body, "the run's processes", default=(), ignore=ignored)


def _fork(
    body: Callable[[int], int],
    work: str,
    *,
    default: Sequence[signal.Signals],
    ignore: Sequence[signal.Signals],
) -> Watchdog:
    read_fd, write_fd = os.pipe()
    # Until the child has its own dispositions, a signal would run the parent's handlers in
    # it (the sidecar's SIGTERM handler asks the sidecar to stop): held pending until then.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {*default, *ignore})
    try:
        pid = os.fork()
        if pid == 0:
            _child(body, work, read_fd, write_fd, default, ignore, mask)
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.close(read_fd)
    # A stuck watchdog must not block the renew thread on a full pipe.
    os.set_blocking(write_fd, False)
    return Watchdog(pid, write_fd, work)


def _child(
    body: Callable[[int], int],
    work: str,
    read_fd: int,
    write_fd: int,
    default: Sequence[signal.Signals],
    ignore: Sequence[signal.Signals],
    mask: Iterable[int],
) -> NoReturn:
    code = 1
    try:
        for signum in default:
            signal.signal(signum, signal.SIG_DFL)
        for signum in ignore:
            signal.signal(signum, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(write_fd)
        os.setsid()
        _close_other_descriptors(keep=read_fd)
        code = body(read_fd)
    except Exception:
        log.exception("watchdog: failed; it no longer guards %s", work)
    finally:
        os._exit(code)


def _close_other_descriptors(keep: int) -> None:
    # Inherited API connections and the sidecar's listening port must not be held open by
    # the watchdog: a restarted sidecar could not bind it again.
    os.closerange(3, keep)
    os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))


class Verdict(enum.Enum):
    """Why the watchdog stopped listening to its parent."""

    DONE = "done"  # the work is over: exit without stopping anything
    STOP = "stop"  # the parent lost the lease and hands the stop over
    EXPIRED = "expired"  # the deadline passed without a heartbeat: the parent is frozen or stuck
    GONE = "gone"  # the pipe's end: the parent died


class _Parent:
    """What the watchdog hears from its parent: heartbeats, the group to guard, done or stop."""

    def __init__(self, read_fd: int, valid_until: float) -> None:
        self.read_fd = read_fd
        self.valid_until = valid_until
        self.heard_at = time.monotonic()
        self.pgid: int | None = None
        self._pending = b""

    def verdict(self, *, needs_pgid: bool = False) -> Verdict:
        """Block until the parent says done or stop, dies, or lets the deadline pass."""
        while True:
            remaining = self.valid_until - time.monotonic()
            armed = self.pgid is not None or not needs_pgid
            if remaining <= 0 and armed:
                return Verdict.EXPIRED
            ready, _, _ = select.select([self.read_fd], [], [], remaining if armed else None)
            if not ready:
                continue
            chunk = os.read(self.read_fd, 4096)
            if not chunk:
                return Verdict.GONE
            self._pending += chunk
            *lines, self._pending = self._pending.split(b"\n")
            for line in lines:
                word, _, value = line.decode().partition(" ")
                if word == "done":
                    return Verdict.DONE
                if word == "stop":
                    return Verdict.STOP
                if word == "pgid":
                    self.pgid = int(value)
                elif word == "until":
                    self.valid_until = float(value)
                    self.heard_at = time.monotonic()
                else:
                    log.error("watchdog: ignoring an unknown message %r", line)


def watch(read_fd: int, valid_until: float, grace: float) -> int:
    """`run`'s watchdog: stop CMD's group when the deadline passes without a heartbeat or on EOF."""
    parent = _Parent(read_fd, valid_until)
    verdict = parent.verdict(needs_pgid=True)
    if verdict is Verdict.DONE or parent.pgid is None:
        return 0
    if verdict is Verdict.GONE:
        log.error(
            "watchdog: cronlock-sidecar run died; stopping CMD (process group %d)", parent.pgid
        )
    else:
        log.error(
            "watchdog: no fresh lease heartbeat from cronlock-sidecar run; "
            "stopping CMD (process group %d)",
            parent.pgid,
        )
    stop_group(parent.pgid, grace)
    return 0


def run_pids(sidecar_pid: int, proc_root: Path = PROC) -> list[int]:
    """The run's processes as the watchdog sees them: all but itself, the sidecar and PID 1."""
    return visible_pids(proc_root, exclude={sidecar_pid})


def watch_pod(
    read_fd: int, valid_until: float, grace: float, sidecar_pid: int, proc_root: Path = PROC
) -> int:
    """`hold`'s watchdog: stop the run's processes when the sidecar cannot vouch for the lease."""
    parent = _Parent(read_fd, valid_until)
    verdict = parent.verdict()
    if verdict is Verdict.DONE:
        return 0
    pids = run_pids(sidecar_pid, proc_root)
    if verdict is Verdict.GONE:
        # Nothing renews the lease any more, and the runtime may kill this process soon after
        # the sidecar (the container's init) died: no grace, and the log line after the kill.
        kill_at_once(pids)
        log.error(
            "watchdog: the sidecar (pid %d) died and nothing keeps the lease any more; "
            "killed the run's processes at once (%s)",
            sidecar_pid,
            _listed(pids),
        )
        return 0
    if verdict is Verdict.EXPIRED:
        log.error(
            "watchdog: no lease heartbeat from the sidecar for %.1fs; "
            "stopping the run's processes (%s)",
            time.monotonic() - parent.heard_at,
            _listed(pids),
        )
    else:
        log.warning(
            "watchdog: the sidecar lost the lease; stopping the run's processes (%s)",
            _listed(pids),
        )
    terminate_then_kill(pids, grace)
    return 0


def _listed(pids: Sequence[int]) -> str:
    return "pids " + ", ".join(map(str, pids)) if pids else "none left"
