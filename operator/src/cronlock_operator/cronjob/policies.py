"""What a run does when its lock is held: the policy annotation and its wait timeout.

skip (the default) gives up at once, wait retries until the wait timeout, replace asks the
holder to yield and takes over (the newest run wins), observe runs anyway and records the
overlap. The sidecar carries them out (cronlock_sidecar/policy.py).
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

Policy = Literal["skip", "wait", "replace", "observe"]
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
    if seconds > 0 and policy not in ("wait", "replace"):
        raise InvalidConfig(
            contract.ANNOTATION_WAIT_TIMEOUT,
            text,
            f'only applies with {contract.ANNOTATION_POLICY}: "wait" or "replace"; with '
            f'"{policy}" a run never waits for the lock (set the policy to wait or replace, '
            "or remove the wait-timeout)",
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
