"""cronlock's lease holder: takes, renews and releases a coordination.k8s.io/v1 Lease."""
