"""Holding the Lease: the keeper that claims, renews and releases it, the heartbeat
that renews it on time, the overlap policies, and the outcomes they report."""
