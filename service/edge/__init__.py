"""What stands between a peer and either transport, and between the transports and the workers:
the doors that admit every connection (callers identified by uid, token or address; their bounds,
resets and upload budgets), credentials, requests in flight per caller, the access log, and
clients' shared memory regions with their permission checks. Imports only service's shared
modules (errors, settings), never another room."""
