"""The KServe V2 / Triton gRPC transport: the servicer, the one mapping of errors to statuses,
message codecs, clients' shared memory, auth and credentials, the access log, and the doors that
admit every connection (callers identified by uid, token or address; their bounds and upload
budgets), which the REST front uses too. Imports service.core (never service.workers or
service.ops)."""
