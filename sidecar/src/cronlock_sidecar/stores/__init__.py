"""The lock's stores beside the Lease, Redis and PostgreSQL: the one door to them (`open`),
each store's client (`redisstore`, `pgstore`), a store's URL (`url`), and the document
and clock rules both share (`documents`, `frames`)."""
