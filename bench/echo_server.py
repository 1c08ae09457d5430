"""The benchmark's ceiling: a bare grpc.aio server speaking the same protocol with the same
stubs as the daemon, answering ModelInfer and ModelStreamInfer with a fixed reply and no model,
and the example model's metadata and config, which Triton's perf_analyzer reads before it runs.

    python -m bench.echo_server PORT [SOCKET]

With SOCKET it also answers on that unix socket (the daemon's clients on its node use its own).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import grpc
import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2, service_pb2_grpc
from tritonclient.grpc import service_pb2 as pb

CONFIG = Path(__file__).resolve().parent.parent / "models" / "mnist_cnn" / "config.pbtxt"


class EchoServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Answers every request with a fixed, well-formed reply of the model's output shape."""

    def __init__(self) -> None:
        self._logits = np.zeros((1, 10), np.float32).tobytes()
        self._config = text_format.Parse(CONFIG.read_text(), model_config_pb2.ModelConfig())
        tensor = pb.ModelMetadataResponse.TensorMetadata
        self._metadata = pb.ModelMetadataResponse(
            name=self._config.name, versions=["1"], platform=self._config.platform,
            inputs=[tensor(name="image", datatype="FP32", shape=[-1, 1, 28, 28])],
            outputs=[tensor(name="logits", datatype="FP32", shape=[-1, 10])])

    def _reply(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        reply = pb.ModelInferResponse(model_name=request.model_name, model_version="1",
                                      id=request.id)
        reply.outputs.add(name="logits", datatype="FP32", shape=[1, 10])
        reply.raw_output_contents.append(self._logits)
        return reply

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=True)

    async def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name="echo", version="1")

    async def ModelMetadata(self, request, context):
        return self._metadata

    async def ModelConfig(self, request, context):
        return pb.ModelConfigResponse(config=self._config)

    async def ModelInfer(self, request, context):
        return self._reply(request)

    async def ModelStreamInfer(self, request_iterator, context):
        async for request in request_iterator:
            yield pb.ModelStreamInferResponse(infer_response=self._reply(request))


async def serve_echo(port: int, socket: str = "") -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(EchoServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    if socket:
        server.add_insecure_port(f"unix:{socket}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(serve_echo(int(sys.argv[1]), *sys.argv[2:3]))
