"""Warm-up batches run on every engine instance before a model is READY, so that no request pays
a first-shape cost: Triton's `model_warmup` from config.pbtxt as written (each entry `count`
times, default once), else one zero batch per bucket (or one sample for models without buckets),
twice: ONNX Runtime's CUDA provider captures a CUDA graph on a session's second run. Without
`model_warmup`, a model whose config leaves a dim free (-1) is not warmed, as in Triton: any
size made up for it (a 1x1 image) may be one the model cannot take, and its failure would drop a
device that serves every real request.
`input_data_file` is read, as Triton does, from the model's `warmup/` folder, never outside it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2

from service import contract
from service.core.buckets import Buckets
from service.core.model import ModelSpec
from service.core.repository import file_name, read_model_file
from service.core.types import Tensors
from service.errors import ConfigError


@dataclass(frozen=True)
class WarmupBatch:
    name: str
    inputs: Tensors
    size: int  # rows on the batch axis (1 for a model without one)
    count: int


def warmup_batches(spec: ModelSpec, buckets: Buckets | None, folder: Path) -> list[WarmupBatch]:
    if spec.config.model_warmup:
        return [_configured(spec, i, w, folder) for i, w in enumerate(spec.config.model_warmup)]
    if any(d < 0 for t in spec.inputs for d in t.dims):
        return []  # no size to warm at that the model is known to take
    sizes = buckets.sizes if buckets else (1,)
    batched = spec.max_batch_size > 0
    return [WarmupBatch(f"bucket {size}", {
        t.name: np.zeros(((size,) if batched else ()) + t.dims,
                         contract.served_dtype(t.datatype)) for t in spec.inputs}, size, 2)
        for size in sizes]


def _configured(spec: ModelSpec, index: int, warmup: model_config_pb2.ModelWarmup,
                folder: Path) -> WarmupBatch:
    where = f"model {spec.name!r}: model_warmup[{index}] ({warmup.name!r})"
    batched = spec.max_batch_size > 0
    size = warmup.batch_size or 1
    if batched and not 1 <= size <= spec.max_batch_size:
        raise ConfigError(f"{where}: batch_size {size} is outside 1 to max_batch_size "
                          f"{spec.max_batch_size}")
    expected = {t.name: t for t in spec.inputs}
    if set(warmup.inputs) != set(expected):
        raise ConfigError(f"{where}: inputs {sorted(warmup.inputs)}; expected exactly "
                          f"{sorted(expected)}")
    inputs = {}
    rng = np.random.default_rng(0)
    for name, given in warmup.inputs.items():
        spec_t = expected[name]
        datatype = contract.wire_from_config(given.data_type)
        if datatype != spec_t.datatype:
            raise ConfigError(f"{where}: inputs[{name!r}].data_type TYPE_{datatype}; expected "
                              f"TYPE_{spec_t.datatype} as the input's config says")
        dims = tuple(given.dims)
        if not spec_t.matches(dims):
            raise ConfigError(f"{where}: inputs[{name!r}].dims {list(dims)}; expected "
                              f"{list(spec_t.dims)} (per sample, without the batch axis)")
        shape = ((size,) if batched else ()) + dims
        dtype = contract.served_dtype(datatype)
        source = given.WhichOneof("input_data_type")
        if source == "input_data_file":
            file = file_name(given.input_data_file, spec.name,
                             f"model_warmup[{index}].inputs[{name!r}].input_data_file",
                             "the model's warmup/ folder")
            inputs[name] = _from_file(where, name, folder / "warmup" / file, dims, dtype, shape)
        elif source == "random_data":
            inputs[name] = rng.random(shape).astype(dtype)
        else:
            inputs[name] = np.zeros(shape, dtype)
    return WarmupBatch(warmup.name, inputs, size, max(warmup.count, 1))


def _from_file(where: str, name: str, path: Path, dims: tuple[int, ...], dtype: np.dtype,
               shape: tuple[int, ...]) -> np.ndarray:
    """One sample's raw bytes, repeated over the batch as Triton does."""
    sample = np.frombuffer(read_model_file(path, f"{where}: inputs[{name!r}].input_data_file"),
                           dtype)
    if sample.size != int(np.prod(dims)):
        raise ConfigError(f"{where}: inputs[{name!r}].input_data_file {path.name!r} holds "
                          f"{sample.size} values; expected {int(np.prod(dims))} for dims "
                          f"{list(dims)}")
    return np.broadcast_to(sample.reshape(dims), shape).copy()
