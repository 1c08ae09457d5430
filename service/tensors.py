"""Tensor datatypes across the three vocabularies: protocol ("FP32"), config (TYPE_FP32), numpy."""

from __future__ import annotations

import numpy as np
from tritonclient.grpc import model_config_pb2

Tensors = dict[str, np.ndarray]  # tensors by name: a request's inputs, a model's outputs

# Fixed-size datatypes only: BYTES (strings) is not an image-recognition input.
_NUMPY_BY_WIRE: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
_WIRE_BY_NUMPY = {v: k for k, v in _NUMPY_BY_WIRE.items()}

# Where a datatype's values sit in InferTensorContents, for clients that send typed contents.
CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}



def wire_names() -> list[str]:
    return list(_NUMPY_BY_WIRE)


def numpy_dtype(wire: str) -> np.dtype | None:
    return _NUMPY_BY_WIRE.get(wire)


def wire_dtype(dtype: np.dtype) -> str:
    return _WIRE_BY_NUMPY[np.dtype(dtype)]


def wire_from_config(data_type: int) -> str:
    """TYPE_FP32 (config enum) -> "FP32" (protocol)."""
    return model_config_pb2.DataType.Name(data_type).removeprefix("TYPE_")

