"""Talking to the lock's store: the seam (`seam`: what a store must do) and the Lease store
on the Kubernetes API (`kubeapi`) with its HTTP/1.1 client and kubeconfig reader. The
stores beside it, Redis and PostgreSQL, are `cronlock_sidecar.stores`."""
