"""`hold`: the native sidecar that decides, keeps the Lease while the pod runs, gives it back."""

from __future__ import annotations

import logging
import stat
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

from cronlock_sidecar.contract import EXIT_CONFIG, EXIT_OK, JITTER_FILE, SUCCESS_FILE
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
from cronlock_sidecar.lock.jitter import Jitter, jitter_of
from cronlock_sidecar.lock.maxhold import exceeded_line
from cronlock_sidecar.lock.ticks import Tick, tick_of_job
from cronlock_sidecar.microtime import read_time
from cronlock_sidecar.options import Options
from cronlock_sidecar.pod.processes import PROC, terminate_then_kill, visible_pids
from cronlock_sidecar.pod.rundir import (
    read_decision,
    tick_env,
    write_atomically,
    write_decision,
)
from cronlock_sidecar.pod.state import SidecarState
from cronlock_sidecar.pod.watchdog import REAP_TIMEOUT, start_for_pod
from cronlock_sidecar.transport.seam import ApiError, LeaseTransport

log = logging.getLogger("cronlock_sidecar.hold")


class RunGuard(Protocol):
    """The watchdog process as `hold` drives it (watchdog.Watchdog; a fake in tests)."""

    pid: int

    def valid_until(self, deadline: float) -> None: ...

    def stop_run(self) -> bool: ...

    def dismiss(self) -> None: ...

    def reap(self, timeout: float) -> int | None: ...


# (monotonic deadline, kill grace) -> a running watchdog
StartWatchdog = Callable[[float, float], RunGuard]


def pod_tick(options: Options) -> Tick | None:
    """The tick this pod's run works: its Job named `<cronjob>-<minutes>` by the CronJob
    controller, the run id the Job's uid (a retry pod of the Job is the same run); None for
    a manual run (`kubectl create job --from`) or a sidecar the operator gave no CronJob."""
    at = tick_of_job(options.cronjob, options.job_name)
    if at is None:
        return None
    return Tick(options.cronjob, at, options.job_name, options.job_uid)


class Holder:
    """One pod's sidecar: decision, renewals, loss handling and release on stop."""

    def __init__(
        self,
        options: Options,
        transport: LeaseTransport,
        clock: Clock,
        state: SidecarState,
        stop: threading.Event,
        *,
        start_watchdog: StartWatchdog | None = None,
        proc_root: Path = PROC,
        serve: Callable[[], None] = lambda: None,
        success_file: Path = Path(SUCCESS_FILE),
    ) -> None:
        if options.lease is None:
            raise ValueError("hold needs a lease")
        self.options = options
        self.state = state
        self.stop = stop
        self.proc_root = proc_root
        # A lock in a store: the file the work creates to say its tick succeeded, in the
        # volume the operator mounts for it (contract.SUCCESS_DIR); see _success_file.
        self.success_file = success_file
        # Starts the HTTP endpoints; called once the decision is written, or before a
        # restarted sidecar confirms its Lease (pod/serving.py). Again is a no-op.
        self._serve = serve
        self._start_watchdog = start_watchdog or self._fork_watchdog
        # Under `stop: signal`, from before the gate may let the run start until release.
        self.watchdog: RunGuard | None = None
        self.run_dir = Path(options.run_dir)
        self.keeper = LeaseKeeper(
            transport,
            options.lease,
            options.identity,
            options.timing,
            clock,
            options.job_name,
            yields=options.policy == "replace",
            caps_holds=options.store is not None,
            tick=pod_tick(options),
            cluster=options.cluster,
            permits=options.permits,
        )
        # The renew thread and the main thread may both see the loss; it is handled once.
        self._loss_lock = threading.Lock()
        self._loss_handled = False
        # --max-hold: when (monotonic) the run acquired the lock, and whether it was stopped
        # at the bound. Once stopped the run stays stopped, the Lease stays held (renewed)
        # until the pod ends, and the release gives it back (docs/DECISIONS.md).
        self._held_since: float | None = None
        self._bound_passed = False
        # Under `policy: observe` nothing stops the run: /held always answers 200.
        state.update(never_stop=options.observe)

    def run(self) -> int:
        """Until SIGTERM (the `stop` event): exit 0 after releasing what we hold."""
        previous = read_decision(self.run_dir)
        if previous in {"skip", "unavailable", "overlap", "already-ran"}:
            log.info("restarted after deciding %r; staying idle", previous)
            self.state.update(decision=previous)
            self._serve()
            return self._idle()
        if previous == "run":
            self._serve()
            acquired = self._resume()
            if acquired is not None:
                self._held_since = self._acquired_at(acquired)
        elif self._jitter():
            return self._idle()
        else:
            acquired = self._decide()
            self._held_since = self.keeper.clock.monotonic()
        if acquired is None:
            return self._idle()
        if self.stop.is_set():
            self._release()
            return EXIT_OK
        return self._keep()

    def _decide(self) -> Acquired | None:
        try:
            result = acquire(
                self.keeper,
                policy=self.options.policy,
                wait_timeout=self.options.wait_timeout,
                pause=self._pause,
            )
        except PermitsDisagree as error:
            # A store's document says another N (CRONLOCK_PERMITS): its runs of the old N
            # hold it. This run skips, counted as a skip, rather than fail its pod.
            log.error("%s; this run will not start", error)
            return self._write("skip", None)
        except ApiError as error:
            if self.options.observe:
                log.error("%s; observe policy: running anyway", error)
                return self._write("overlap", None)
            log.error("%s; this run will not start", error)
            return self._write("unavailable", None)
        if self.stop.is_set() and not isinstance(result, Acquired):
            return None
        if not isinstance(result, Acquired):
            if self.options.observe and not result.why:
                record_overlap(self.keeper, result.holder)
                return self._write("overlap", None)
            log.info("%s", result.message())
            if result.already_ran:
                return self._write("already-ran", None, skip_line=result.message())
            return self._write("skip", None)
        if not self._guard_the_run("this run will not start"):
            self._release()
            return self._write("unavailable", None)
        return self._write("run", result)

    def _jitter(self) -> bool:
        """Wait out the run's jitter before deciding, so that no lock is held meanwhile, and
        serve the endpoints; True when asked to stop (the pod was deleted: nothing was taken,
        so nothing is released, and the sidecar exits 0)."""
        if self.options.jitter <= 0:
            return False
        tick = self.keeper.tick
        now = self.keeper.clock.now()
        jitter = (
            self._manual_jitter(now)
            if tick is None
            else jitter_of(self.options.jitter, now, (tick.cronjob, tick.at))
        )
        log.info("%s", jitter.line())
        self._serve()
        if self.stop.wait(jitter.wait):
            log.info("stopped during the jitter, before the run started: nothing to release")
            return True
        return False

    def _manual_jitter(self, now: datetime) -> Jitter:
        """A manual run's random offset, drawn once per pod: a restarted sidecar (the run
        dir outlives it) waits for the instant drawn first, not for a new one, so that the
        gate, which counts from its own start, is not outwaited."""
        bound = self.options.jitter
        path = self.run_dir / JITTER_FILE
        try:
            start_text, offset_text = path.read_text(encoding="utf-8").split()
            start = datetime.fromtimestamp(float(start_text), UTC)
            offset = float(offset_text)
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as error:
            log.warning("cannot read the jitter drawn before in %s: %s; drawing again", path, error)
        else:
            if 0 <= offset < bound:
                left = (start + timedelta(seconds=offset) - now).total_seconds()
                return Jitter(start, offset, max(0.0, left), bound)
        jitter = jitter_of(bound, now, None)
        try:
            write_atomically(path, f"{now.timestamp()!r} {jitter.offset!r}\n")
        except OSError as error:
            log.warning("cannot keep the jitter in %s: %s", path, error)
        return jitter

    def _write(
        self, decision: str, acquired: Acquired | None, *, skip_line: str = ""
    ) -> Acquired | None:
        # The work reads its tick before it starts: tick.env is written before the gate opens.
        success_file = self._success_file() if decision == "run" else None
        tick_text = (
            tick_env(
                self.keeper.tick,
                self.keeper.previous_tick,
                self.keeper.last_success,
                success_file="" if success_file is None else str(success_file),
                permit=acquired.permit if acquired is not None else None,
            )
            if decision in ("run", "overlap")
            else ""
        )
        try:
            write_decision(
                self.run_dir,
                decision,
                acquired,
                self.options.timing,
                tick_text=tick_text,
                skip_line=skip_line,
            )
        except OSError as error:
            log.error("--run-dir: cannot write the decision into %s: %s", self.run_dir, error)
            if acquired is not None:
                self._release()
            raise SystemExit(EXIT_CONFIG) from error
        self.state.update(
            decision=decision,
            held=acquired is not None,
            fencing_token=acquired.transitions if acquired else None,
        )
        self._serve()
        return acquired

    def _pause(self, seconds: float) -> bool:
        """Between a `wait` or `replace` policy's attempts: serve meanwhile, then sleep."""
        self._serve()
        return self.stop.wait(seconds)

    def _resume(self) -> Acquired | None:
        """A restarted sidecar of a pod that is running its work: ours still, or lost."""
        self.state.update(decision="run")
        started = self.keeper.clock.monotonic()
        while not self.stop.is_set():
            try:
                acquired = self.keeper.resume()
            except ApiError as error:
                waited = self.keeper.clock.monotonic() - started
                if waited >= self.keeper.timing.renew_deadline:
                    log.error(
                        "lease %s lost: cannot confirm it after restart: %s", error.lease, error
                    )
                    self._lost()
                    return None
                log.warning("cannot confirm the lease after restart, retrying: %s", error)
                self.stop.wait(min(self.keeper.timing.renew, 1.0))
                continue
            if acquired is None:
                self._lost()
                return None
            self.state.update(held=True, fencing_token=acquired.transitions)
            self._guard_the_run("the run's processes go on without it")
            return acquired
        return None

    def _guard_the_run(self, otherwise: str) -> bool:
        """Under `stop: signal`, fork the process that stops the run if this one cannot."""
        if self.options.stop != "signal" or self.options.observe:
            return True
        try:
            self.watchdog = self._start_watchdog(self.keeper.valid_until(), self.options.kill_grace)
        except OSError as error:
            log.error("cannot start the watchdog process: %s; %s", error, otherwise)
            return False
        log.info(
            "watchdog process %d guards the run: it stops the run's processes if this sidecar "
            "stops renewing lease %s or dies",
            self.watchdog.pid,
            self.keeper.lease,
        )
        return True

    def _acquired_at(self, acquired: Acquired) -> float:
        """When (monotonic) a resumed hold was acquired, from the Lease's acquireTime: a
        restarted sidecar must not give its run a fresh max-hold."""
        now = self.keeper.clock.monotonic()
        at = read_time(acquired.acquire_time)
        if at is None:
            return now
        return now - max(0.0, (self.keeper.clock.now() - at).total_seconds())

    def _fork_watchdog(self, valid_until: float, grace: float) -> RunGuard:
        return start_for_pod(valid_until, grace, self.proc_root)

    def _on_renew(self, result: RenewResult) -> None:
        self.state.count_renewal(
            result.outcome.value,
            self.keeper.last_renew_sent() if result.outcome is RenewOutcome.RENEWED else None,
        )
        # A run stopped at its bound has no watchdog left to tell (it exits once it stopped
        # the run's processes): the renewals go on for the Lease alone.
        if (
            result.outcome is RenewOutcome.RENEWED
            and self.watchdog is not None
            and not self._bound_passed
        ):
            self.watchdog.valid_until(self.keeper.valid_until())
        if result.outcome is RenewOutcome.LOST:
            # At once, from the renew thread: the main thread sleeps until SIGTERM or deadline.
            self._lost()

    def _keep(self) -> int:
        self.state.mark_renewed(self.keeper.last_renew_sent())
        heartbeat = Heartbeat(self.keeper, self._on_renew)
        heartbeat.start()
        try:
            while not self.stop.wait(self._until_next_check()):
                if self.keeper.check_deadline() or self.keeper.lost:
                    self._lost()
                    return self._idle()
                if self._until_bound() == 0.0:
                    self._stop_at_bound()
        finally:
            heartbeat.stop(join_timeout=0.1)
        self._release()
        return EXIT_OK

    def _until_deadline(self) -> float:
        """Seconds until the renew deadline; a renew moves it later and we only re-check."""
        return max(0.0, self.keeper.valid_until() - self.keeper.clock.monotonic())

    def _until_bound(self) -> float | None:
        """Seconds until the run's max-hold passes (0.0: it has); None: no bound to wait for."""
        if self.options.max_hold <= 0 or self._held_since is None or self._bound_passed:
            return None
        at = self._held_since + self.options.max_hold
        return max(0.0, at - self.keeper.clock.monotonic())

    def _until_next_check(self) -> float:
        bound = self._until_bound()
        deadline = self._until_deadline()
        return deadline if bound is None else min(deadline, bound)

    def _stop_at_bound(self) -> None:
        """The run held the lock for its max-hold: stop it as a run that lost its lock is
        stopped, but keep renewing the Lease until the pod ends (its release gives it back),
        so no other run may start while this one's processes are still being stopped."""
        self._bound_passed = True
        assert self._held_since is not None  # _until_bound said the bound passed
        line = exceeded_line(
            self.keeper.clock.monotonic() - self._held_since, self.options.max_hold
        )
        log.error(
            "lease %s: %s: /held answers 503 so the run is stopped; the lease stays held "
            "until the pod ends",
            self.keeper.lease,
            line,
        )
        # The operator reads it from the pod's status and posts MaxHoldExceeded.
        try:
            with open(self.options.termination_log, "w", encoding="utf-8") as message:
                message.write(line + "\n")
        except OSError as error:
            log.warning("cannot write %s: %s", self.options.termination_log, error)
        self.state.update(stopping=True)
        self._stop_the_run()

    def _lost(self) -> None:
        with self._loss_lock:
            if self._loss_handled:
                return
            self._loss_handled = True
        self.state.update(held=False)
        self.state.count_lost()
        if self.options.observe:
            log.error(
                "lease %s is no longer held by %s (observe policy: the run goes on)",
                self.keeper.lease,
                self.keeper.identity,
            )
            return
        log.error(
            "lease %s is no longer held by %s: /held answers 503 so the run is stopped",
            self.keeper.lease,
            self.keeper.identity,
        )
        self._stop_the_run()

    def _stop_the_run(self) -> None:
        """Under `stop: signal`, stop the run's processes (under liveness /held's 503 does)."""
        if self.options.stop != "signal":
            return
        # The watchdog stops them: it finishes the job even if this process freezes meanwhile.
        if self.watchdog is not None and self.watchdog.stop_run():
            return
        helpers = {self.watchdog.pid} if self.watchdog is not None else set()
        threading.Thread(
            target=terminate_then_kill,
            args=(visible_pids(self.proc_root, exclude=helpers), self.options.kill_grace),
            name="cronlock-stop",
            daemon=True,
        ).start()

    def _success_file(self) -> Path | None:
        """Where the work says its tick succeeded, or None where it cannot: only a tick's
        run on a lock in a store, with the operator's volume mounted. On a Lease the operator
        records a tick's success when its Job completes, and the holders' policy refuses it
        from a pod; a manual run records none (lock/ticks.py)."""
        if self.options.store is None or self.keeper.tick is None:
            return None
        return self.success_file if self.success_file.parent.is_dir() else None

    def _work_succeeded(self) -> bool:
        """Whether the work created the success file (a regular file: nothing is opened or
        followed) and the hold was never lost nor stopped at its max-hold: then the release
        records the tick's success."""
        path = self._success_file()
        if path is None or self.keeper.lost:
            return False
        if self._bound_passed:
            log.info("the run was stopped at its max-hold: its tick's success is not recorded")
            return False
        try:
            info = path.lstat()
        except OSError:
            log.info("the work did not create %s: its tick's success is not recorded", path)
            return False
        if not stat.S_ISREG(info.st_mode):
            log.warning("%s is not a regular file: the tick's success is not recorded", path)
            return False
        log.info("the work created %s: the release records its tick's success", path)
        return True

    def _release(self) -> None:
        # First: a watchdog that outlived us would take our exit for a death and kill.
        self._dismiss_watchdog()
        released = self.keeper.release(succeeded=self._work_succeeded())
        self.state.count_release("released" if released else "failed")
        self.state.update(held=False)
        self._reap_watchdog()

    def _dismiss_watchdog(self) -> None:
        if self.watchdog is not None:
            self.watchdog.dismiss()

    def _reap_watchdog(self) -> None:
        if self.watchdog is not None and self.watchdog.reap(REAP_TIMEOUT) is None:
            log.warning("the watchdog process %d has not exited yet", self.watchdog.pid)

    def _idle(self) -> int:
        """A native sidecar that exits is restarted: wait for the pod's SIGTERM instead."""
        self._serve()
        self.stop.wait()
        if self.keeper.held or self.keeper.lost:
            self._release()
        else:
            self._dismiss_watchdog()
            self._reap_watchdog()
        return EXIT_OK
