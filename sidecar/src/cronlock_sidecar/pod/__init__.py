"""What the sidecar does in its pod: the run directory the gate reads, the probe and
metrics endpoints, the watchdog that stops the work, processes, signals and logs."""
