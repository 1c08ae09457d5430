"""The KServe V2 / Triton gRPC transport: the servicer, the one mapping of errors to statuses,
message codecs, the token interceptor and the per-listener limits, behind the doors of
service.edge. Imports service.edge and service.core (never service.workers or service.ops)."""
