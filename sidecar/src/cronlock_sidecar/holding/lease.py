"""The Lease protocol as a state machine over a clock and a transport, so it is testable offline."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping
from datetime import datetime

from cronlock_sidecar.contract import (
    ALREADY_RAN,
    ANNOTATION_PERMITS,
    HOLDER_POLICY_DENIAL,
    LABEL_MANAGED_BY,
    MANAGED_BY,
)
from cronlock_sidecar.holding.outcomes import (
    Acquired,
    Busy,
    Clock,
    PermitsDisagree,
    RenewOutcome,
    RenewResult,
    SystemClock,
)
from cronlock_sidecar.lock.model import (
    Timing,
    annotations_of,
    claimed,
    is_expired,
    read_lease,
    released,
    renewed,
)
from cronlock_sidecar.lock.permits import (
    Permit,
    claimed_permit,
    document_count,
    held_by,
    permits_of,
    read_permits,
    released_permit,
    renewed_permit,
)
from cronlock_sidecar.lock.ticks import (
    Tick,
    TickRecord,
    already_ran,
    believed,
    read_record,
    read_success,
    record_of,
    success_of,
)
from cronlock_sidecar.microtime import format_microtime
from cronlock_sidecar.transport.seam import (
    ApiError,
    Conflict,
    Forbidden,
    Lease,
    LeaseRef,
    LeaseTransport,
    NotFound,
    Unavailable,
)

__all__ = [
    "Acquired",
    "Busy",
    "Clock",
    "LeaseKeeper",
    "PermitsDisagree",
    "RenewOutcome",
    "RenewResult",
    "SystemClock",
]

log = logging.getLogger("cronlock_sidecar.lease")

# Past this many write races in one acquire the API server is too contended to decide on.
MAX_CONFLICTS = 10


def conflicts_allowed(permits: int) -> int:
    """How many write conflicts in a row a claim or renewal rides out on a lock of
    `permits`: MAX_CONFLICTS, and two more per other holder, since in a burst (every
    holder claiming at one tick, or renewing after an API-server pause) each round of
    retries has one winner. Measured on the real API server at N = 16 (docs/PERFORMANCE.md,
    "Permits"): a claim met 10 and a renewal 11, past a flat limit of 10."""
    return MAX_CONFLICTS + 2 * (max(permits, 1) - 1)


def holder_of(lease: Lease) -> str:
    return read_lease(lease).holder


class LeaseKeeper:
    """Acquires, renews and releases one permit of one Lease for one identity; never
    re-acquires after loss.

    A lock of N permits (lock/permits.py; N from the document) is held one permit at a
    time: a claim takes our Job's own permit (a retry pod), else the lowest free one, else
    the lowest expired one, each judged by the one-holder rules, in one compare and swap
    with the tick record; renewals and releases write only our permit. N = 1 is the lock
    of one holder, the Lease's spec.
    """

    def __init__(
        self,
        transport: LeaseTransport,
        lease: LeaseRef,
        identity: str,
        timing: Timing,
        clock: Clock,
        job_name: str = "",
        yields: bool = True,
        *,
        caps_holds: bool = False,
        tick: Tick | None = None,
        cluster: str = "",
        records_of: str = "",
        permits: int | None = None,
    ) -> None:
        self.transport = transport
        self.lease = lease
        self.identity = identity
        self.timing = timing
        self.clock = clock
        self.job_name = job_name
        # Whether a replace run's request (cronlock.io/yield-to) stops this hold: only a
        # run that is itself of policy replace agreed to be replaced; any pod on the
        # account may write the request.
        self.yields = yields
        # A lock in a store: a stored hold is believed at most for our own duration (the
        # store's rule for a takeover is the same), since whoever has the store's URL may
        # write any duration; on a Lease the holders' policy and the operator bound it.
        self.believed_at_most: float | None = timing.lease_duration_seconds if caps_holds else None
        # The N this run requires (`run --permits N`): written on a document that has none,
        # a document with another N refused (PermitsDisagree). None: the document's N.
        self.permits = permits
        self._permit = 0  # the permit we hold or held last
        # Each tick at most once (lock/ticks.py): the tick this run works (None: a manual
        # run, today's rules) and the cluster its record names.
        self.tick = tick
        self.cluster = cluster
        # Whose records (claim and success) the claim remembers for the work: our tick's
        # CronJob, or for a manual run the one it names (`run --tick-of`; "" none).
        self.records_of = tick.cronjob if tick is not None else records_of
        self._previous_tick: TickRecord | None = None
        self._last_success: TickRecord | None = None
        self._state_lock = threading.Lock()
        self._record: Lease | None = None
        self._last_renew_sent = -math.inf
        self._held = False
        self._lost = False
        self._taken_by_other = False
        self._closing = False
        # The replace run we yielded to: our release names it.
        self._replaced_by = ""

    # --- state -----------------------------------------------------------------
    @property
    def held(self) -> bool:
        with self._state_lock:
            return self._held

    @property
    def lost(self) -> bool:
        with self._state_lock:
            return self._lost

    @property
    def previous_tick(self) -> TickRecord | None:
        """The believed claim record of `records_of` as read before our claim (None: none,
        or no CronJob named): what the work gets as CRONLOCK_PREVIOUS_TICK."""
        with self._state_lock:
            return self._previous_tick

    @property
    def last_success(self) -> TickRecord | None:
        """The believed success record of `records_of` as read before our claim (None:
        none, or no CronJob named): what the work gets as CRONLOCK_LAST_SUCCESS_TICK."""
        with self._state_lock:
            return self._last_success

    def _my_record(self) -> TickRecord | None:
        return None if self.tick is None else record_of(self.tick, self.identity, self.cluster)

    @property
    def permit(self) -> int:
        """The number of the permit we hold (or held last): 0 on a lock of one permit."""
        with self._state_lock:
            return self._permit

    def _lock_permits(self, current: Lease) -> tuple[Permit, ...]:
        """The lock's permits as this keeper judges them (a store's rules keep the same
        permits: docs/DECISIONS.md, "Permits in a store")."""
        return read_permits(current)

    def _mine(self, current: Lease) -> Permit | None:
        permits = self._lock_permits(current)
        index = self.permit
        return permits[index] if index < len(permits) else None

    def _my_holder(self, current: Lease) -> str:
        """Who holds our permit on `current` ("" if nobody, or it is no permit any more)."""
        mine = self._mine(current)
        return mine.holder if mine is not None else ""

    def _with_permits(self, current: Lease) -> Lease:
        """`current` as our claim writes it: with the N we require if it says none or
        another N while no permit of it is held (a lock whose runs all agreed on a new N
        once the old N's runs ended: a store's rule 1, docs/DECISIONS.md);
        PermitsDisagree while a run of the other N (none: 1) holds it."""
        if self.permits is None:
            return current
        text = annotations_of(current).get(ANNOTATION_PERMITS)
        said = "1" if text is None else str(text)  # a lock that says none is of one permit
        if text is not None and document_count(text) == self.permits:
            return current
        if said != "1" or self.permits != 1:
            now = self.clock.now()
            if any(
                permit.holder
                and not is_expired(
                    permit, now, self.timing.skew, believed_at_most=self.believed_at_most
                )
                for permit in read_permits(current)
            ):
                # A run of the other N holds it (of one permit: a run that believes it
                # works alone), so this run may not change N under it.
                raise PermitsDisagree(self.lease, said, self.permits)
        metadata = dict(current.get("metadata") or {})
        metadata["annotations"] = {
            **annotations_of(current),
            ANNOTATION_PERMITS: str(self.permits),
        }
        return {**current, "metadata": metadata}

    @property
    def replaced_by(self) -> str:
        """The replace run this holder yielded to ("" if none asked)."""
        with self._state_lock:
            return self._replaced_by

    def valid_until(self) -> float:
        """Monotonic time until which we may act as holder without a further renew."""
        with self._state_lock:
            return self._last_renew_sent + self.timing.renew_deadline

    def last_renew_sent(self) -> float:
        with self._state_lock:
            return self._last_renew_sent

    def check_deadline(self) -> bool:
        """Declare the Lease lost once the renew deadline passed; True if lost."""
        with self._state_lock:
            if not self._held:
                return self._lost
            overdue = self.clock.monotonic() - self._last_renew_sent
            if overdue < self.timing.renew_deadline:
                return False
            self._held = False
            self._lost = True
        log.error(
            "lease %s lost by %s: no successful renew for %.1fs (renew deadline %.1fs)",
            self.lease,
            self.identity,
            overdue,
            self.timing.renew_deadline,
        )
        return True

    def _mark_lost(self, detail: str, *, taken: bool) -> RenewResult:
        with self._state_lock:
            was_held = self._held
            self._held = False
            self._lost = True
            self._taken_by_other = self._taken_by_other or taken
        if was_held:
            log.error("lease %s lost by %s: %s", self.lease, self.identity, detail)
        return RenewResult(RenewOutcome.LOST, detail)

    def _hold(self, written: Lease, sent: float) -> None:
        with self._state_lock:
            self._record = written
            self._last_renew_sent = max(self._last_renew_sent, sent)
            self._held = True

    # --- acquire ---------------------------------------------------------------
    def try_acquire(self) -> Acquired | Busy:
        """One decision: take the Lease if it is free, ours or our Job's, else report the holder.

        Raises Forbidden or Unavailable when the API server refuses or cannot be reached.
        """
        if self.lost:
            raise RuntimeError("a lost lease is never re-acquired by the same keeper")
        attempts, allowed = 0, conflicts_allowed(self.permits or 1)
        while attempts < allowed:
            attempts += 1
            try:
                current = self.transport.get(self.lease)
            except NotFound:
                result = self._create()
                if result is not None:
                    return result
                continue
            allowed = max(allowed, conflicts_allowed(permits_of(current)))
            decided = self._decide(current)
            if decided is not None:
                return decided
        raise Unavailable("acquire", self.lease, f"{attempts} write conflicts in a row")

    def resume(self) -> Acquired | None:
        """After a restart in the same pod: renew if the Lease still names us and was renewed
        within the renew deadline, else None (lost).

        Never takes a free Lease: this pod already ran its work under an earlier acquire. A
        Lease that still names us but was last renewed longer ago than the renew deadline is
        not resumed either: past that deadline the run should already have been stopped (the
        other runs believe it for ttl + skew only), so its work went on unguarded, and
        renewing would make /held answer 200 for a run that was not guarded. It fails closed.
        """
        for _ in range(MAX_CONFLICTS):
            try:
                current = self.transport.get(self.lease)
            except NotFound:
                self._mark_lost("the Lease was deleted", taken=True)
                return None
            current = self._with_permits(current)
            mine = held_by(self._lock_permits(current), self.identity)
            holder = holder_of(current) if mine is None else mine.holder
            if mine is not None:
                with self._state_lock:
                    self._permit = mine.number
            if holder != self.identity:
                with self._state_lock:
                    self._lost = True
                    self._taken_by_other = True
                log.error(
                    "lease %s lost by %s while restarting: now held by %s",
                    self.lease,
                    self.identity,
                    holder or "nobody",
                )
                return None
            asking = self._yield_request(current)
            if asking:
                self._yield(current, asking)
                return None
            silent = self._silent_for(current)
            if silent is not None:
                with self._state_lock:
                    self._lost = True
                log.error(
                    "lease %s lost by %s while restarting: last renewed %.1fs ago, past the "
                    "renew deadline (%.1fs); the run went unguarded meanwhile, so it is "
                    "stopped, not resumed",
                    self.lease,
                    self.identity,
                    silent,
                    self.timing.renew_deadline,
                )
                return None
            result = self._decide(current)
            if isinstance(result, Acquired):
                return result
        raise Unavailable("update", self.lease, f"{MAX_CONFLICTS} write conflicts in a row")

    def _create(self) -> Acquired | None:
        now = self.clock.now()
        body: Lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.lease.name,
                "namespace": self.lease.namespace,
                "labels": {LABEL_MANAGED_BY: MANAGED_BY},
            },
            "spec": {},
        }
        if self.permits is not None:
            body["metadata"]["annotations"] = {ANNOTATION_PERMITS: str(self.permits)}
        self._remember_records({}, now)  # no document: no record came before
        body = claimed(body, self.identity, self.timing, now, self.job_name, self._my_record())
        sent = self.clock.monotonic()
        try:
            written = self.transport.create(self.lease, body)
        except Conflict:
            return None
        return self._took(written, sent, resumed=False, reason="created", permit=0)

    def _silent_for(self, current: Lease) -> float | None:
        """Seconds since the Lease's last renewal if that is past our renew deadline, else None.

        Only a hold of ours renewed within the deadline is one we may renew as it is: the
        renew deadline is when a holder gives up, so a hold silent for longer ended then.
        """
        mine = self._mine(current)
        renewed_at = mine.renewed_at if mine is not None else None
        if renewed_at is None:
            return math.inf
        silent = (self.clock.now() - renewed_at).total_seconds()
        return silent if silent >= self.timing.renew_deadline else None

    def _decide(self, current: Lease) -> Acquired | Busy | None:
        current = self._with_permits(current)
        permits = self._lock_permits(current)
        if len(permits) > 1:
            return self._decide_permit(current, permits)
        holder = holder_of(current)
        now = self.clock.now()
        if holder == self.identity:
            body = renewed(current, self.timing, now)
            reason = "resumed"
        else:
            reason_or_busy = self._free_reason(current, holder, now)
            if isinstance(reason_or_busy, Busy):
                return reason_or_busy
            reason = reason_or_busy
            body = claimed(
                current, self.identity, self.timing, now, self.job_name, self._my_record()
            )
        sent = self.clock.monotonic()
        try:
            written = self.transport.replace(self.lease, body)
        except Conflict:
            return None
        except Forbidden as error:
            if reason != "expired" or HOLDER_POLICY_DENIAL not in error.detail:
                raise
            record = read_lease(current)
            ago = (now - record.renewed_at).total_seconds() if record.renewed_at else math.inf
            return Busy(
                self.lease,
                holder,
                ago,
                0.0,
                clearing=True,
                acquired_at=record.acquire_time,
                yield_to=record.yield_to,
            )
        return self._took(written, sent, resumed=reason == "resumed", reason=reason, permit=0)

    def _decide_permit(self, current: Lease, permits: tuple[Permit, ...]) -> Acquired | Busy | None:
        """`_decide` on a lock of N > 1 permits: renew ours, or claim one, or Busy."""
        now = self.clock.now()
        mine = held_by(permits, self.identity)
        if mine is not None:
            index, reason = mine.number, "resumed"
            body = renewed_permit(current, index, self.timing, now)
        else:
            blocked = self._lock_blocks(current, holder_of(current), now)
            if blocked is not None:
                return blocked
            chosen = self._free_permit(current, permits, now)
            if isinstance(chosen, Busy):
                return chosen
            index, reason = chosen
            body = claimed_permit(
                current, index, self.identity, self.timing, now, self.job_name, self._my_record()
            )
        sent = self.clock.monotonic()
        try:
            written = self.transport.replace(self.lease, body)
        except Conflict:
            return None
        except Forbidden as error:
            if reason != "expired" or HOLDER_POLICY_DENIAL not in error.detail:
                raise
            taken = permits[index]
            ago = (now - taken.renewed_at).total_seconds() if taken.renewed_at else math.inf
            return Busy(
                self.lease,
                taken.holder,
                ago,
                0.0,
                clearing=True,
                acquired_at=taken.acquire_time,
                permits=tuple(permit.holder for permit in permits),
            )
        return self._took(written, sent, resumed=reason == "resumed", reason=reason, permit=index)

    def _free_permit(
        self, current: Lease, permits: tuple[Permit, ...], now: datetime
    ) -> tuple[int, str] | Busy:
        """The permit our claim takes and why, or Busy when all N are held.

        Our Job's own permit first (a retry pod takes over its Job's hold at once, so a
        Job never holds two), then the lowest free one, then the lowest expired one (which
        only the operator may clear where the holders' policy says so)."""
        if self.job_name:
            for permit in permits:
                if permit.holder and permit.holder_job == self.job_name:
                    return permit.number, "earlier pod of the same Job"
        for permit in permits:
            if not permit.holder:
                return permit.number, "free"
        for permit in permits:
            stale = is_expired(
                permit, now, self.timing.skew, believed_at_most=self.believed_at_most
            )
            if stale or permit.renewed_at is None:
                return permit.number, "expired"
        first = min(permits, key=lambda permit: permit.expires_at or now)
        renewed_ago = (now - first.renewed_at).total_seconds() if first.renewed_at else 0.0
        return Busy(
            self.lease,
            first.holder,
            renewed_ago,
            min(first.duration_seconds or 0, self.believed_at_most or math.inf) - renewed_ago,
            acquired_at=first.acquire_time,
            yield_to=read_lease(current).yield_to,
            permits=tuple(permit.holder for permit in permits),
        )

    def _lock_blocks(self, current: Lease, holder: str, now: datetime) -> Busy | None:
        """What ends a claim whatever permit is free (freeze, our Job replaced, our tick
        already run); else None, with the records the work is told remembered."""
        record = read_lease(current)
        if record.frozen(now):
            # `cronlock freeze`: every run on the lock skips, whatever its policy.
            return Busy(self.lease, holder, 0.0, 0.0, why="frozen", other=record.freeze_note())
        if self.job_name and self.job_name in record.replaced_jobs:
            # Our Job's run yielded to a replace run: this retry must not take it back.
            return Busy(self.lease, holder, 0.0, 0.0, why="replaced", other=record.replaced_by)
        if self.tick is not None:
            ran = self._tick_already_ran(current, now)
            if ran is not None:
                # Whatever the policy: waiting, replacing or observing cannot make a tick
                # that another run claimed ours again.
                return Busy(
                    self.lease,
                    holder,
                    0.0,
                    0.0,
                    why=ALREADY_RAN,
                    other=ran.who(),
                    tick=self.tick,
                    record=ran,
                )
        self._remember_records(annotations_of(current), now)
        return None

    def _free_reason(self, current: Lease, holder: str, now: datetime) -> str | Busy:
        blocked = self._lock_blocks(current, holder, now)
        if blocked is not None:
            return blocked
        record = read_lease(current)
        if not holder:
            return "free"
        if self.job_name and record.holder_job == self.job_name:
            return "earlier pod of the same Job"
        expired = is_expired(record, now, self.timing.skew, believed_at_most=self.believed_at_most)
        if expired or record.renewed_at is None:
            return "expired"
        renewed_ago = (now - record.renewed_at).total_seconds()
        return Busy(
            self.lease,
            holder,
            renewed_ago,
            min(record.duration_seconds or 0, self.believed_at_most or math.inf) - renewed_ago,
            acquired_at=record.acquire_time,
            yield_to=record.yield_to,
        )

    def _tick_already_ran(self, current: Lease, now: datetime) -> TickRecord | None:
        """The lock's record of our CronJob if it says our tick was worked by another run."""
        assert self.tick is not None
        record = read_record(annotations_of(current), self.tick.cronjob)
        return already_ran(self.tick, record, now, self.timing.skew)

    def _remember_records(self, annotations: Mapping[str, object], now: datetime) -> None:
        """`records_of`'s believed claim and success records on the document our claim is
        about to replace: the previous and the last successful tick the work is told."""
        name = self.records_of
        previous = believed(read_record(annotations, name), now, self.timing.skew) if name else None
        success = believed(read_success(annotations, name), now, self.timing.skew) if name else None
        with self._state_lock:
            self._previous_tick = previous
            self._last_success = success

    def _took(
        self, written: Lease, sent: float, *, resumed: bool, reason: str, permit: int
    ) -> Acquired:
        with self._state_lock:
            self._permit = permit
        self._hold(written, sent)
        permits = self._lock_permits(written)
        taken = permits[permit]
        acquired = Acquired(
            lease=self.lease,
            holder=self.identity,
            transitions=taken.transitions,
            acquire_time=format_microtime(taken.acquire_time) if taken.acquire_time else "",
            resumed=resumed,
            reason=reason,
            permit=permit,
        )
        verb = "resumed" if resumed else "acquired"
        if len(permits) > 1:
            log.info(
                "lease %s permit %d of %d %s by %s (transitions %d, %s)",
                self.lease,
                permit,
                len(permits),
                verb,
                self.identity,
                acquired.transitions,
                reason,
            )
            return acquired
        log.info(
            "lease %s %s by %s (transitions %d, %s)",
            self.lease,
            verb,
            self.identity,
            acquired.transitions,
            reason,
        )
        return acquired

    # --- renew -----------------------------------------------------------------
    def renew(self) -> RenewResult:
        """One guarded renew; a Lease that names another holder is lost at once."""
        with self._state_lock:
            if not self._held or self._closing or self._record is None:
                return RenewResult(RenewOutcome.LOST, "not held")
            record = self._record
            index = self._permit
        body = renewed_permit(record, index, self.timing, self.clock.now())
        sent = self.clock.monotonic()
        try:
            written = self.transport.replace(self.lease, body)
        except Conflict:
            return self._renew_after_conflict()
        except NotFound as error:
            return self._mark_lost(f"the Lease was deleted ({error.detail})", taken=True)
        except ApiError as error:
            return self._renew_failed(error)
        return self._renewed_ok(written, sent)

    def _renew_after_conflict(self) -> RenewResult:
        """Another write came between (on a lock of N permits, mostly another holder's
        renewal): re-read and renew our permit at once, a bounded number of times."""
        attempts, allowed = 0, MAX_CONFLICTS
        while attempts < allowed:
            attempts += 1
            try:
                current = self.transport.get(self.lease)
            except NotFound as error:
                return self._mark_lost(f"the Lease was deleted ({error.detail})", taken=True)
            except ApiError as error:
                return self._renew_failed(error)
            allowed = max(allowed, conflicts_allowed(permits_of(current)))
            holder = self._my_holder(current)
            if holder != self.identity:
                return self._mark_lost(f"now held by {holder or 'nobody'}", taken=True)
            asking = self._yield_request(current)
            if asking:
                return self._yield(current, asking)
            record = read_lease(current)
            if record.frozen_stop and record.frozen(self.clock.now()):
                # `cronlock freeze --stop-running`: stopped as a lost run is, then released.
                with self._state_lock:
                    self._record = current
                return self._mark_lost(
                    f"lock {record.freeze_note()}, with --stop-running; stopping this run",
                    taken=False,
                )
            body = renewed_permit(current, self.permit, self.timing, self.clock.now())
            sent = self.clock.monotonic()
            try:
                written = self.transport.replace(self.lease, body)
            except Conflict:
                continue
            except ApiError as error:
                return self._renew_failed(error)
            return self._renewed_ok(written, sent)
        return self._renew_failed(
            Unavailable("update", self.lease, f"{attempts} write conflicts in a row")
        )

    def _renewed_ok(self, written: Lease, sent: float) -> RenewResult:
        holder = self._my_holder(written)
        if holder != self.identity:
            return self._mark_lost(f"now held by {holder or 'nobody'}", taken=True)
        with self._state_lock:
            if not self._held:
                return RenewResult(RenewOutcome.LOST, "lost before the renew returned")
            self._record = written
            self._last_renew_sent = max(self._last_renew_sent, sent)
        log.debug("lease %s renewed by %s", self.lease, self.identity)
        return RenewResult(RenewOutcome.RENEWED)

    # --- yield (replace policy) -------------------------------------------------------
    def _yield_request(self, current: Lease) -> str:
        """The replace run that asked us to yield, "" if none did (or we never yield)."""
        asking = read_lease(current).yield_to
        if len(self._lock_permits(current)) > 1:
            # Policy replace asks no holder of a lock of N > 1 permits to yield (not
            # supported yet): a yield-to there is no replace run's, and stops nobody.
            return ""
        return asking if self.yields and asking != self.identity else ""

    def _yield(self, current: Lease, asking: str) -> RenewResult:
        """A replace run asked us to yield: lost as if taken (the run is stopped), but
        released by us once it has stopped, the release naming who replaced us."""
        with self._state_lock:
            self._record = current
            self._replaced_by = asking
        return self._mark_lost(f"replaced by {asking}; stopping this run", taken=False)

    def _renew_failed(self, error: ApiError) -> RenewResult:
        left = self.valid_until() - self.clock.monotonic()
        log.warning(
            "lease %s renew failed (%.1fs left before giving up): %s", self.lease, left, error
        )
        return RenewResult(RenewOutcome.FAILED, str(error))

    # --- release ---------------------------------------------------------------
    def release(self, budget: float = 3.0, *, succeeded: bool = False) -> bool:
        """Give the Lease back if it is still ours, within `budget` seconds; True if released.

        `succeeded`: the run's work ended in success (only `run` knows it): the release also
        records our tick as our CronJob's last success (lock/ticks.py `success_of`)."""
        with self._state_lock:
            record = self._record
            self._closing = True
            if record is None or self._taken_by_other:
                return False
        deadline = self.clock.monotonic() + budget
        current = record
        while True:
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                log.warning(
                    "lease %s not released within %.1fs; it expires by TTL", self.lease, budget
                )
                return False
            try:
                self.transport.replace(
                    self.lease, self._released(current, succeeded), timeout=remaining
                )
            except Conflict:
                current_or_none = self._reread_for_release(remaining)
                if current_or_none is None:
                    return False
                current = current_or_none
                continue
            except ApiError as error:
                log.warning("lease %s not released, it expires by TTL: %s", self.lease, error)
                return False
            with self._state_lock:
                self._held = False
            log.info("lease %s released by %s", self.lease, self.identity)
            return True

    def _released(self, current: Lease, succeeded: bool) -> Lease:
        """`current` with our permit given back (only ours: the others' entries as read)."""
        success = self._success(current) if succeeded else None
        index = self.permit
        if index == 0:
            return released(
                current,
                self.identity,
                self.clock.now(),
                replaced_by=self.replaced_by,
                job_name=self.job_name,
                success=success,
            )
        return released_permit(current, index, self.identity, self.clock.now(), success=success)

    def _success(self, current: Lease) -> TickRecord | None:
        """The success record our release writes on `current`, if any (lock/ticks.py)."""
        if self.tick is None:
            return None
        return success_of(
            annotations_of(current),
            self.tick.cronjob,
            self.tick.at,
            self.tick.run,
            self.clock.now(),
            self.timing.skew,
        )

    def _reread_for_release(self, timeout: float) -> Lease | None:
        try:
            current = self.transport.get(self.lease, timeout=timeout)
        except ApiError as error:
            log.warning("lease %s not released, it expires by TTL: %s", self.lease, error)
            return None
        holder = self._my_holder(current)
        if holder != self.identity:
            log.info("lease %s not released: held by %s now", self.lease, holder or "nobody")
            with self._state_lock:
                self._held = False
                self._taken_by_other = True
            return None
        return current
