"""The lock model, shared with the operator: one way to read, judge and write a Lease,
and the duration syntax of the annotations."""
