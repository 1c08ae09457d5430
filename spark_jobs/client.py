"""The executor-side client: one channel per Python worker, reused across tasks, sending
large batches to the node-local daemon with a few requests in flight."""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc as grpcclient

from service import tensors


@dataclass(frozen=True)
class ModelInterface:
    """What a job needs to know of a served model, read once on the driver."""

    name: str
    input_name: str
    input_datatype: str
    input_dims: tuple[int, ...]  # one sample's shape
    output_name: str
    max_batch_size: int

    @classmethod
    def fetch(cls, address: str, model: str) -> ModelInterface:
        client = grpcclient.InferenceServerClient(address)
        try:
            config = client.get_model_config(model).config
        finally:
            client.close()
        if config.max_batch_size < 1 or len(config.input) != 1 or not config.output:
            raise ValueError(f"model {model!r}: scoring needs one batched input and an output; "
                             f"max_batch_size is {config.max_batch_size}, "
                             f"inputs are {[i.name for i in config.input]}")
        tensor = config.input[0]
        return cls(model, tensor.name, tensors.wire_from_config(tensor.data_type),
                   tuple(tensor.dims), config.output[0].name, config.max_batch_size)


@functools.cache
def _client(address: str) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(address)


def infer(address: str, model: ModelInterface, samples: np.ndarray, batch_size: int,
          inflight: int) -> np.ndarray:
    """Runs `samples` (N, *dims) through the daemon in requests of at most `batch_size`."""
    client = _client(address)
    step = max(1, min(batch_size, model.max_batch_size))

    def one(start: int) -> np.ndarray:
        chunk = samples[start:start + step]
        tensor = grpcclient.InferInput(model.input_name, list(chunk.shape),
                                       model.input_datatype)
        tensor.set_data_from_numpy(chunk)
        result = client.infer(model.name, [tensor],
                              outputs=[grpcclient.InferRequestedOutput(model.output_name)])
        return result.as_numpy(model.output_name)

    starts = range(0, len(samples), step)
    with ThreadPoolExecutor(max(1, inflight)) as pool:
        return np.concatenate(list(pool.map(one, starts)))
