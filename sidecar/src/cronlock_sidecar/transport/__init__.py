"""Talking to the lock's store: the seam (`seam`: what a store must do), the Lease store on
the Kubernetes API (`kubeapi`) with its HTTP/1.1 client and kubeconfig reader, and the one
door to the stores beside it, Redis and PostgreSQL (`stores`)."""
