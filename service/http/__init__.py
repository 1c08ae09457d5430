"""The daemon's KServe V2 HTTP/REST transport (--http-port): JSON and Triton's binary tensors,
converted to the protocol's types and answered by the same operations as gRPC. Imports
service.protocol, service.edge and service.core."""
