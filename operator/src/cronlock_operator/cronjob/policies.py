"""What a run does when its lock is held: the policy annotation and its wait timeout.

skip (the default) gives up at once, wait retries until the wait timeout, replace asks the
holder to yield and takes over (the newest run wins), observe runs anyway and records the
overlap, queue waits as a suspended Job (no pod) until the operator lets it go, then as
wait, up to the queue timeout. The sidecar carries them out (cronlock_sidecar/policy.py).
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping
from typing import Final, Literal, cast

from cronlock_operator.cronjob.invalid import InvalidConfig, duration_annotation
from cronlock_sidecar import contract
from cronlock_sidecar.lock.maxhold import max_hold_problem
from cronlock_sidecar.lock.model import Timing, replace_wait_timeout

Policy = Literal["skip", "wait", "replace", "observe", "queue"]
MAX_WAIT_TIMEOUT_SECONDS: Final = 24 * 3600


def parse_policy(annotations: Mapping[str, str], default: Policy) -> Policy:
    value = annotations.get(contract.ANNOTATION_POLICY)
    if value is None:
        return default
    for policy in typing.get_args(Policy):
        if value == policy:
            return cast(Policy, policy)
    expected = ", ".join(f'"{policy}"' for policy in contract.POLICIES)
    close = difflib.get_close_matches(value, contract.POLICIES, n=1)
    hint = f' (did you mean "{close[0]}"?)' if close else ""
    raise InvalidConfig(
        contract.ANNOTATION_POLICY, value, f"is not a policy{hint}; expected {expected}"
    )


def parse_wait_timeout(annotations: Mapping[str, str], policy: Policy, timing: Timing) -> float:
    """Seconds a run waits for the lock: as annotated, else 0, or under replace the
    default `replace_wait_timeout` (a frozen holder's Lease has surely expired)."""
    text = annotations.get(contract.ANNOTATION_WAIT_TIMEOUT)
    if text is None:
        return replace_wait_timeout(timing) if policy == "replace" else 0.0
    seconds = duration_annotation(contract.ANNOTATION_WAIT_TIMEOUT, text)
    if seconds > MAX_WAIT_TIMEOUT_SECONDS:
        raise InvalidConfig(
            contract.ANNOTATION_WAIT_TIMEOUT, text, "is out of range; expected at most 24h"
        )
    if seconds > 0 and policy == "queue":
        raise InvalidConfig(
            contract.ANNOTATION_WAIT_TIMEOUT,
            text,
            f'does not apply with {contract.ANNOTATION_POLICY}: "queue"; a queued run waits '
            f"up to {contract.ANNOTATION_QUEUE_TIMEOUT} (set that instead, or remove the "
            "wait-timeout)",
        )
    if seconds > 0 and policy not in ("wait", "replace"):
        raise InvalidConfig(
            contract.ANNOTATION_WAIT_TIMEOUT,
            text,
            f'only applies with {contract.ANNOTATION_POLICY}: "wait" or "replace"; with '
            f'"{policy}" a run never waits for the lock (set the policy to wait or replace, '
            "or remove the wait-timeout)",
        )
    return seconds


# Without `queue-timeout`: the schedule's shortest gap, so a queued tick is never older
# than one interval (the next tick then takes its place); this when the schedule has none.
DEFAULT_QUEUE_TIMEOUT_SECONDS: Final = 3600.0
MIN_QUEUE_TIMEOUT_SECONDS: Final = 1.0


def parse_queue_timeout(
    annotations: Mapping[str, str], policy: Policy, shortest_gap: float | None
) -> float:
    """Seconds a queued Job may wait (suspended, then its pod for the lock): as annotated,
    else the schedule's shortest gap (`shortest_gap`, at most 24h), else an hour; 0 for
    any policy but queue, which refuses the annotation."""
    text = annotations.get(contract.ANNOTATION_QUEUE_TIMEOUT)
    if policy != "queue":
        if text is not None:
            raise InvalidConfig(
                contract.ANNOTATION_QUEUE_TIMEOUT,
                text,
                f'only applies with {contract.ANNOTATION_POLICY}: "queue"; with "{policy}" no '
                "run is queued (set the policy to queue, or remove the queue-timeout)",
            )
        return 0.0
    if text is None:
        if shortest_gap is None:
            return DEFAULT_QUEUE_TIMEOUT_SECONDS
        return min(max(shortest_gap, MIN_QUEUE_TIMEOUT_SECONDS), MAX_WAIT_TIMEOUT_SECONDS)
    seconds = duration_annotation(contract.ANNOTATION_QUEUE_TIMEOUT, text)
    if not MIN_QUEUE_TIMEOUT_SECONDS <= seconds <= MAX_WAIT_TIMEOUT_SECONDS:
        raise InvalidConfig(
            contract.ANNOTATION_QUEUE_TIMEOUT,
            text,
            "is out of range; expected 1s to 24h (how long a tick may stay queued)",
        )
    return seconds


def parse_max_hold(annotations: Mapping[str, str], policy: Policy, timing: Timing) -> float:
    """Seconds a run may hold its lock from its acquire (0: no bound); the sidecar stops a
    run past it as it stops one that lost its lock (lock/maxhold.py has the bounds)."""
    text = annotations.get(contract.ANNOTATION_MAX_HOLD)
    if text is None:
        return 0.0
    seconds = duration_annotation(contract.ANNOTATION_MAX_HOLD, text)
    problem = max_hold_problem(seconds, timing, policy)
    if problem is not None:
        raise InvalidConfig(contract.ANNOTATION_MAX_HOLD, text, problem)
    return seconds
