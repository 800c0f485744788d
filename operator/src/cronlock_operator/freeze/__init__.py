"""`cronlock freeze` / `unfreeze`: stop every run on a lock for a while, from its Lease."""
