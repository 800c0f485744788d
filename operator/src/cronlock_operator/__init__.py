"""cronlock's operator: injects the lease sidecar into opted-in CronJobs and accounts for skips."""
