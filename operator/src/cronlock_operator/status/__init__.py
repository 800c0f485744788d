"""`cronlock status`: who holds the Lease of each guarded CronJob, for people and scripts.

Four layers, each importing only those before it: `model` (rows from CronJobs and Leases,
pure), `render` (tables and JSON), `api` (the client and what it lists), `cli` (flags,
exit codes, the watch loop).
"""

from __future__ import annotations

from cronlock_operator.status.cli import kubectl_complete, main

__all__ = ["kubectl_complete", "main"]
