"""The KServe V2 / Triton gRPC transport: the servicer, the one mapping of errors to statuses,
message codecs, clients' shared memory, auth and credentials, the access log, the unix socket.
Imports service.core (never service.workers or service.ops)."""
