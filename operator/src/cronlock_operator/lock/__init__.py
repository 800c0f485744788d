"""The lock as a CronJob asks for it: its settings parsed and checked, its schedule,
who may share it, and whose a Lease is."""
