"""`cronlock lint`: the operator's own checks on manifests, before they reach a cluster.

Three layers, each importing only those before it: `documents` (YAML streams into
CronJobs with the lines of their annotations), `checks` (the reconciler's decision and
lock consent on each, as findings), `cli` (paths, output, exit codes). Nothing here talks
to an API server.
"""
