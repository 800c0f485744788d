"""The running operator: watch caches and the work queue, the executor, Events, metrics,
leader election, and the kopf wiring."""
