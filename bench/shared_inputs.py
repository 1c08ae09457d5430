"""A request whose input lies in system shared memory: the region is created here, filled once
and registered with the daemon over its unix socket (shared memory needs a caller the kernel
names), so that the load clients send only its name and the bytes never travel in messages."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import shared_memory as shm

from service import contract


@contextlib.contextmanager
def shared_request(socket_url: str, model: str, input_name: str,
                   image: np.ndarray) -> Iterator[pb.ModelInferRequest]:
    """A request of `model` whose input `input_name` is `image` (with its batch axis), in a
    region registered with the daemon at `socket_url` for the length of the block."""
    name = f"bench-{model}-{os.getpid()}"
    handle = shm.create_shared_memory_region(name, f"/{name}", image.nbytes)
    client = grpcclient.InferenceServerClient(socket_url)
    try:
        shm.set_shared_memory_region(handle, [np.ascontiguousarray(image)])
        client.register_system_shared_memory(name, f"/{name}", image.nbytes)
        request = pb.ModelInferRequest(model_name=model)
        tensor = request.inputs.add(name=input_name, datatype=contract.wire_dtype(image.dtype),
                                    shape=list(image.shape))
        tensor.parameters["shared_memory_region"].string_param = name
        tensor.parameters["shared_memory_byte_size"].int64_param = image.nbytes
        yield request
        client.unregister_system_shared_memory(name)
    finally:
        client.close()
        shm.destroy_shared_memory_region(handle)
