"""What cronlock writes into a CronJob: the sidecar, the gate, the probe and the skip
rule, and exactly how to take them out again."""
