"""Evidence for "at most one run": a mutual-exclusion checker under injected faults."""
