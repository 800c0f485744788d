"""`run`: the whole lock pattern around one command, for use without the operator."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from types import FrameType

from cronlock_sidecar.contract import (
    ENV_FENCING_TOKEN,
    ENV_PERMIT,
    EXIT_CONFIG,
    EXIT_MAX_HOLD,
    EXIT_SKIPPED,
    EXIT_SOFTWARE_LOST,
    EXIT_UNAVAILABLE,
)
from cronlock_sidecar.holding.heartbeat import Heartbeat
from cronlock_sidecar.holding.lease import (
    Acquired,
    Clock,
    LeaseKeeper,
    PermitsDisagree,
    RenewOutcome,
    RenewResult,
)
from cronlock_sidecar.holding.policy import acquire, record_overlap
from cronlock_sidecar.lock import ticks
from cronlock_sidecar.lock.jitter import jitter_of
from cronlock_sidecar.lock.maxhold import exceeded_line
from cronlock_sidecar.options import Options
from cronlock_sidecar.pod import watchdog
from cronlock_sidecar.pod.processes import stop_group
from cronlock_sidecar.pod.stopping import StopPipe
from cronlock_sidecar.transport.seam import ApiError, LeaseTransport

log = logging.getLogger("cronlock_sidecar.run")

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec hook asking Linux to SIGTERM CMD when `run` dies: the second line of defence."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return hook


class Runner:
    """One guarded execution of CMD."""

    def __init__(
        self,
        options: Options,
        transport: LeaseTransport,
        clock: Clock,
        tick: ticks.Tick | None = None,
    ) -> None:
        if options.lease is None:
            raise ValueError("run needs a lease")
        self.options = options
        self.tick = tick
        self.keeper = LeaseKeeper(
            transport,
            options.lease,
            options.identity,
            options.timing,
            clock,
            options.job_name,
            yields=options.policy == "replace",
            caps_holds=options.store is not None,
            tick=tick,
            records_of=options.tick_of,
            # Redis' library keeps the permit rules (docs/STORES.md, "Permits in a store");
            # in PostgreSQL the lock is one permit (options refuse --permits N > 1 there):
            # nothing to write on its document.
            permits=(
                options.permits if options.store is None or options.store.kind == "redis" else None
            ),
        )
        self.stop = threading.Event()
        self._stop_pipe = StopPipe(self.stop)
        self.process: subprocess.Popen[bytes] | None = None
        self.signals: list[int] = []
        # Set when CMD has ended or the lease was lost; the main thread sleeps on nothing else.
        self._wake = threading.Event()
        self._exit_code: int | None = None
        # --max-hold: when (monotonic) the lock was acquired.
        self._held_since = 0.0

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.signals.append(signum)
        self._stop_pipe.request()
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signum)
            except ProcessLookupError:
                log.debug("CMD already gone when forwarding %s", signal.Signals(signum).name)

    def execute(self) -> int:
        previous = {signum: signal.signal(signum, self._on_signal) for signum in FORWARDED_SIGNALS}
        try:
            return self._execute()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _execute(self) -> int:
        options = self.options
        if options.jitter > 0:
            tick = self.tick
            jitter = jitter_of(
                options.jitter,
                self.keeper.clock.now(),
                None if tick is None else (tick.cronjob, tick.at),
            )
            log.info("%s", jitter.line())
            # Before the lock is taken: no lock is held meanwhile, and a signal ends the wait.
            if self.stop.wait(jitter.wait):
                return 128 + self.signals[0] if self.signals else EXIT_SKIPPED
        try:
            result = acquire(
                self.keeper,
                policy=options.policy,
                wait_timeout=options.wait_timeout,
                pause=self.stop.wait,
            )
        except PermitsDisagree as error:
            log.error("%s; not running CMD", error)
            return EXIT_CONFIG
        except ApiError as error:
            if options.observe:
                log.error("%s; observe policy: running CMD anyway", error)
                return self._unguarded()
            log.error("%s; not running CMD", error)
            return EXIT_UNAVAILABLE
        if not isinstance(result, Acquired):
            if self.signals:
                return 128 + self.signals[0]
            if options.observe and not result.why:
                record_overlap(self.keeper, result.holder)
                return self._unguarded()
            log.info("%s", result.message())
            return EXIT_SKIPPED
        self._held_since = self.keeper.clock.monotonic()
        if self.tick is not None:
            previous, last_success = self.keeper.previous_tick, self.keeper.last_success
            log.info(
                "run works tick %s of %s (run %s; previous tick on the lock: %s; last "
                "successful tick: %s)",
                ticks.format_tick(self.tick.at),
                self.tick.cronjob,
                self.tick.run,
                "none" if previous is None else ticks.format_tick(previous.at),
                "none" if last_success is None else ticks.format_tick(last_success.at),
            )
        code: int | None = None
        try:
            if self.signals:
                return 128 + self.signals[0]
            code = self._guarded(result)
            return code
        finally:
            # Only `run` knows its work's outcome: a tick's run that ended 0 records its
            # tick as the last success, in the release's own write (lock/ticks.py).
            self.keeper.release(succeeded=code == 0 and self.tick is not None)

    def _tick_environment(self) -> dict[str, str]:
        """What CMD is told of its tick, as the work is in a pod (tick.env)."""
        return ticks.told(self.tick, self.keeper.previous_tick, self.keeper.last_success)

    def _unguarded(self) -> int:
        """Observe policy without the Lease: CMD runs as it would without cronlock."""
        process = self._spawn({**os.environ, **self._tick_environment()})
        if isinstance(process, int):
            return process
        return _status(process.wait())

    def _spawn(
        self, environment: dict[str, str], announce: Callable[[], None] | None = None
    ) -> subprocess.Popen[bytes] | int:
        """CMD in its own session (so it can be stopped as a group), or the exit code;
        `announce` runs in CMD's process before exec (the watchdog learns its group)."""
        options = self.options
        hooks = [hook for hook in (_die_with_parent(), announce) if hook is not None]

        def before_exec() -> None:
            for hook in hooks:
                hook()

        try:
            self.process = subprocess.Popen(
                options.cmd,
                env=environment,
                start_new_session=True,
                preexec_fn=before_exec if hooks else None,
            )
        except FileNotFoundError as error:
            log.error("cannot run %s: %s", options.cmd[0], error)
            return EXIT_NOT_FOUND
        except PermissionError as error:
            log.error("cannot run %s: %s", options.cmd[0], error)
            return EXIT_NOT_EXECUTABLE
        if self.signals:
            os.killpg(self.process.pid, self.signals[-1])
        return self.process

    def _guarded(self, acquired: Acquired) -> int:
        options = self.options
        guard = (
            _Unwatched()
            if options.observe
            else watchdog.start(self.keeper.valid_until(), options.kill_grace)
        )
        heartbeat: Heartbeat | None = None
        try:
            environment = {**os.environ, **self._tick_environment()}
            # The token is the permit's: fence by the pair (permit, token).
            environment[ENV_FENCING_TOKEN] = str(acquired.transitions)
            environment[ENV_PERMIT] = str(acquired.permit)
            announce = guard.announce_self if isinstance(guard, watchdog.Watchdog) else None
            process = self._spawn(environment, announce)
            if isinstance(process, int):
                return process
            guard.guard(process.pid)  # said already by CMD itself: a parent's second word
            guard.valid_until(self.keeper.valid_until())

            def on_renew(result: RenewResult) -> None:
                if result.outcome is RenewOutcome.RENEWED:
                    guard.valid_until(self.keeper.valid_until())
                elif result.outcome is RenewOutcome.LOST:
                    self._wake.set()

            heartbeat = Heartbeat(self.keeper, on_renew)
            heartbeat.start()
            return self._wait(process)
        finally:
            if heartbeat is not None:
                heartbeat.stop(join_timeout=0.1)
            guard.finish()

    def _reap(self, process: subprocess.Popen[bytes]) -> None:
        """A blocking waitpid on its own thread: no polling while CMD works."""
        self._exit_code = process.wait()
        self._wake.set()

    def _wait(self, process: subprocess.Popen[bytes]) -> int:
        """Sleep until CMD ends, the lease is lost, or the renew deadline; nothing polls."""
        threading.Thread(
            target=self._reap, args=(process,), name="cronlock-reap", daemon=True
        ).start()
        keeper = self.keeper
        while True:
            self._wake.clear()
            code = self._exit_code
            lost = keeper.check_deadline() or keeper.lost
            if code is not None:
                return EXIT_SOFTWARE_LOST if lost and not self.options.observe else _status(code)
            if lost and self.options.observe:
                log.error("lease %s lost (observe policy: CMD goes on)", keeper.lease)
                return _status(process.wait())
            if lost:
                log.error(
                    "lease %s lost: stopping CMD (SIGTERM, SIGKILL after %.1fs)",
                    keeper.lease,
                    self.options.kill_grace,
                )
                stop_group(process.pid, self.options.kill_grace)
                process.wait()
                return EXIT_SOFTWARE_LOST
            now = keeper.clock.monotonic()
            bound = self.options.max_hold
            if bound > 0 and now - self._held_since >= bound:
                return self._stop_at_bound(process, now - self._held_since)
            # A renew moves the deadline later: waking at the old one only re-checks.
            wake_at = keeper.valid_until()
            if bound > 0:
                wake_at = min(wake_at, self._held_since + bound)
            self._wake.wait(max(0.0, wake_at - now))

    def _stop_at_bound(self, process: subprocess.Popen[bytes], held: float) -> int:
        """CMD held the lock for --max-hold: stop its group as a lost lease's is, while the
        heartbeat goes on renewing, then release (in `_execute`) and exit EXIT_MAX_HOLD."""
        log.error(
            "lease %s: %s: stopping CMD (SIGTERM, SIGKILL after %.1fs)",
            self.keeper.lease,
            exceeded_line(held, self.options.max_hold),
            self.options.kill_grace,
        )
        stop_group(process.pid, self.options.kill_grace)
        process.wait()
        return EXIT_MAX_HOLD


def _status(code: int) -> int:
    """CMD's exit status as a shell reports it: 128 + N when signal N ended it."""
    return 128 - code if code < 0 else code


class _Unwatched:
    """Observe policy: no watchdog, since nothing stops the run."""

    def guard(self, pid: int) -> None:
        """Nothing to guard."""

    def valid_until(self, deadline: float) -> None:
        """Nothing to move."""

    def finish(self) -> None:
        """Nothing to end."""
