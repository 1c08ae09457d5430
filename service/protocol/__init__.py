"""KServe V2 inference without a transport: its requests and responses as plain typed classes
(types), what becomes of their tensors (inputs, outputs), the decoding process, and the one
operations object both transports call with the caller's identity (operations), given what a
process answers from elsewhere (providers). Imports service.edge and service.core (never a
transport, service.workers or service.ops)."""
