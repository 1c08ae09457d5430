"""What `--workers N` adds: front-end processes that serve gRPC and REST and hand requests to the
one device owner through shared-memory arenas and a typed channel that carries the protocol's
types. Imports the transports (which a front-end runs), service.protocol, service.edge and
service.core (never service.ops)."""
