"""What `--workers N` adds: front-end processes that serve gRPC and hand requests to the one
device owner through shared-memory arenas and a typed channel. Imports service.grpc and
service.core (never service.ops)."""
