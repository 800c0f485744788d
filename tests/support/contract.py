"""cronlock's published contract, written out as users see it: exit codes, container and
object names. The tests use these literals, not the code's own `cronlock_sidecar.contract`,
so that a change to what users rely on fails here instead of moving along silently
(tests/unit/test_contract.py pins the code to them)."""

from __future__ import annotations

from typing import Final

# Exit codes of `cronlock-sidecar run|gate|hold` and `cronlock status` (sysexits.h).
EXIT_OK: Final = 0
EXIT_SKIPPED: Final = 75  # the lock is held by a live run
EXIT_UNAVAILABLE: Final = 69  # the API server is unreachable, or refused
EXIT_LOST: Final = 70  # the lease was lost during the run
EXIT_CONFIG: Final = 78  # bad configuration

# What injection adds to a job template.
SIDECAR_CONTAINER: Final = "cronlock"
GATE_CONTAINER: Final = "cronlock-gate"

# Objects cronlock makes, and the label on each.
LEASE_PREFIX: Final = "cronlock-"
HOLDER_ROLE_PREFIX: Final = "cronlock-holder-"
MANAGED_BY: Final = ("app.kubernetes.io/managed-by", "cronlock")
LOCK_LABEL: Final = "cronlock.io/lock"
# On Failed Jobs that are cronlock's doing, for KubeJobFailed's exclusion (docs/USAGE.md).
OUTCOME_LABEL: Final = ("cronlock.io/outcome", ("skipped", "replaced"))
