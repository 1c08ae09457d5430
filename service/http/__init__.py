"""The daemon's KServe V2 HTTP/REST front (--http-port): JSON and Triton's binary tensors,
answered by the same servicer as gRPC."""
