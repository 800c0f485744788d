"""A separate process stops CMD when `run` stops vouching for the lease, even if `run` froze."""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time

from cronlock_sidecar.processes import stop_group

log = logging.getLogger("cronlock_sidecar.watchdog")


class Watchdog:
    """The `run` side: tells the watchdog process which group to guard and until when."""

    def __init__(self, pid: int, write_fd: int) -> None:
        self.pid = pid
        self._fd: int | None = write_fd
        # The renew thread sends heartbeats while the main thread may be finishing.
        self._lock = threading.Lock()

    def _send(self, line: str) -> bool:
        with self._lock:
            if self._fd is None:
                return True
            try:
                os.write(self._fd, line.encode() + b"\n")
            except BrokenPipeError:
                return False
            return True

    def guard(self, pgid: int) -> None:
        if not self._send(f"pgid {pgid}"):
            log.error("the watchdog process %d is gone; CMD runs without it", self.pid)

    def valid_until(self, deadline: float) -> None:
        """Heartbeat: CMD may work until this monotonic time without a further heartbeat."""
        if not self._send(f"until {deadline:.6f}"):
            log.error("the watchdog process %d is gone; CMD runs without it", self.pid)

    def finish(self) -> int:
        """CMD has ended: let the watchdog exit (it may have exited already) and reap it."""
        self._send("done")
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)


def start(valid_until: float, grace: float) -> Watchdog:
    """Fork the watchdog before CMD exists, so CMD never runs unwatched."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(write_fd)
            os.setsid()
            # The handlers inherited from `run` would forward signals to a CMD we do not have.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGHUP, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            _close_other_descriptors(keep=read_fd)
            code = watch(read_fd, valid_until, grace)
        finally:
            os._exit(code)
    os.close(read_fd)
    return Watchdog(pid, write_fd)


def _close_other_descriptors(keep: int) -> None:
    # Inherited API connections must not be held open by the watchdog.
    os.closerange(3, keep)
    os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))


def watch(read_fd: int, valid_until: float, grace: float) -> int:
    """Stop the guarded group when the deadline passes without a heartbeat or on EOF."""
    pgid: int | None = None
    expired = False
    pending = b""
    while True:
        if expired and pgid is not None:
            log.error(
                "watchdog: no fresh lease heartbeat from cronlock-sidecar run; "
                "stopping CMD (process group %d)",
                pgid,
            )
            stop_group(pgid, grace)
            return 0
        timeout = None if expired else max(0.0, valid_until - time.monotonic())
        ready, _, _ = select.select([read_fd], [], [], timeout)
        if not ready:
            expired = True
            continue
        chunk = os.read(read_fd, 4096)
        if not chunk:
            if pgid is None:
                return 0
            log.error("watchdog: cronlock-sidecar run died; stopping CMD (process group %d)", pgid)
            stop_group(pgid, grace)
            return 0
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            word, _, value = line.decode().partition(" ")
            if word == "done":
                return 0
            if word == "pgid":
                pgid = int(value)
            elif word == "until":
                valid_until = float(value)
                expired = valid_until <= time.monotonic()
