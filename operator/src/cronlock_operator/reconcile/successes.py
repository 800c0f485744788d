"""A tick's success on its Lease: the operator is the writer that knows a Job succeeded.

The lock's success record (`cronlock.io/succeeded.<cronjob>`, sidecar lock/ticks.py) is the
newest tick whose run succeeded, as that run's claim recorded it. In a cluster the pod
cannot write it: its sidecar does not learn its work's exit code, and what a pod writes of
itself proves nothing (the holders' policy refuses it). The operator counts every finished
Job (runs.py) and so writes it, for a Lease lock, when the claim record still names that
Job's run (its uid) and tick and the tick is newer than the recorded success.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from cronlock_operator.objects import annotation_path, annotations_of, still_at
from cronlock_sidecar import contract
from cronlock_sidecar.lock import ticks
from cronlock_sidecar.lock.model import read_lease


def success_patch(
    lease: Mapping[str, Any],
    cronjob: str,
    at: datetime,
    run: str,
    now: datetime,
    skew_seconds: float,
) -> list[dict[str, Any]] | None:
    """A JSON patch writing the success of run `run` of `cronjob`'s tick `at` on `lease` (as
    just read; it applies only while the Lease is still that version), or None when there
    is nothing to record (`ticks.success_of`)."""
    record = ticks.success_of(annotations_of(lease), cronjob, at, run, now, skew_seconds)
    if record is None:
        return None
    key = ticks.record_key(cronjob, contract.ANNOTATION_SUCCEEDED_PREFIX)
    return [
        still_at(read_lease(lease).resource_version),
        {"op": "add", "path": annotation_path(key), "value": record.text()},
    ]
