"""The KServe V2 / Triton gRPC transport: the servicer (messages <-> the protocol's types, then the
operations of service.protocol), the one mapping of errors to statuses, the token interceptor and
the per-listener limits, behind the doors of service.edge. Imports service.protocol,
service.edge and service.core (never service.http, service.workers or service.ops)."""
