"""Rules about cronlock's Leases in the operator: whose a Lease is (ownership) and who may
join a lock (sharing: consent).
"""
