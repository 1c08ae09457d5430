"""An Arrow batch's input rows as the model's samples: the `tensor` column (raw bytes, or an
array of numbers per row) viewed as the (N, *dims) sample array without a copy, or the columns
of Spark's `image` source decoded image by image; each malformed row gets a message instead."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from service import contract
from spark_jobs.images import decode_image_rows, tensor_row_error
from spark_jobs.interface import ModelInterface

TENSOR_COLUMNS = ("id", "tensor")
IMAGE_COLUMNS = ("id", "height", "width", "nChannels", "data")  # as api.image_columns names them
_BINARY = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_fixed_size_binary)
_LISTS = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)


def _view(column: pa.Array, dtype: np.dtype, dims: tuple[int, ...]) -> np.ndarray:
    """A column without nulls whose values all hold one sample, as (N, *dims) samples."""
    if any(t(column.type) for t in _LISTS):
        return column.flatten().to_numpy(zero_copy_only=False).astype(dtype, copy=False) \
            .reshape(len(column), *dims)
    if pa.types.is_fixed_size_binary(column.type):
        data, start = column.buffers()[1], column.offset * column.type.byte_width
    else:  # variable-size binary: the values lie back to back in the data buffer
        offsets = np.frombuffer(column.buffers()[1], np.int64 if pa.types.is_large_binary(
            column.type) else np.int32)
        data, start = column.buffers()[2], int(offsets[column.offset])
    nbytes = len(column) * int(np.prod(dims)) * dtype.itemsize
    return np.frombuffer(data, np.uint8, nbytes, start).view(dtype).reshape(len(column), *dims)


def decode_tensors(batch: pa.RecordBatch, model: ModelInterface
                   ) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
    """The good rows' samples, which rows are good, and a message per malformed row."""
    dtype = contract.served_dtype(model.input_datatype)
    size = int(np.prod(model.input_dims))
    column = batch.column("tensor")
    if pa.types.is_null(column.type):  # a pandas frame whose rows all lack a tensor
        column = column.cast(pa.binary())
    if not any(t(column.type) for t in _BINARY + _LISTS):
        raise ValueError(f"column tensor is {column.type}: raw bytes or an array of numbers "
                         "expected")
    binary = any(t(column.type) for t in _BINARY)
    lengths = (pc.binary_length if binary else pc.list_value_length)(column)
    held = lengths.to_numpy(zero_copy_only=False)  # NaN for a null row
    good = held == (size * dtype.itemsize if binary else size)
    errors = {}
    for i in np.flatnonzero(~good):
        n = held[i]
        what = "no tensor" if np.isnan(n) else f"{int(n)} values" if not binary else \
            f"{int(n) // dtype.itemsize} values" if n % dtype.itemsize == 0 else f"{int(n)} bytes"
        errors[int(i)] = tensor_row_error(batch.column("id")[i].as_py(), what, model)
    column = column if good.all() else column.filter(pa.array(good))
    return _view(column, dtype, model.input_dims), good, errors


def decode_images(batch: pa.RecordBatch, model: ModelInterface
                  ) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
    """decode_tensors for the columns of Spark's `image` source (api.image_columns)."""
    samples = np.zeros((batch.num_rows, *model.input_dims),
                       contract.served_dtype(model.input_datatype))
    errors = decode_image_rows(zip(*(batch.column(c).to_pylist() for c in IMAGE_COLUMNS)),
                               samples, model)
    good = np.ones(batch.num_rows, bool)
    good[list(errors)] = False
    return samples[good], good, errors
