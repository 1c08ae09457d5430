"""Scoring over Arrow record batches (mapInArrow), the default executor path: the tensor column's
Arrow buffer is viewed as the (N, *dims) sample array without a copy and goes from there into
the call's shared memory region (or the request); outputs are built as Arrow arrays. No pandas,
and no Python per row except for images, which need resizing one by one.

While one batch's requests run, the next batch is read and decoded, so that a task keeps the
daemon busy across Spark's batch boundaries."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from service import contract
from spark_jobs.client import Inference, ModelInterface
from spark_jobs.common_scoring import ENERGY_COLUMN, ScoreOptions, raw_values, top_k
from spark_jobs.images import decode_image_rows, tensor_row_error

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
    errors = decode_image_rows(zip(*(batch.column(c).to_pylist() for c in (
        "id", "height", "width", "nChannels", "data"))), samples, model)
    good = np.ones(batch.num_rows, bool)
    good[list(errors)] = False
    return samples[good], good, errors


def output_batch(batch: pa.RecordBatch, result: Inference, good: np.ndarray,
                 errors: dict[int, str], k: int, keep_errors: bool = False,
                 energy_column: bool = False,
                 raw: tuple[tuple[str, str, tuple[int, ...]], ...] = ()) -> pa.RecordBatch:
    """The scored rows as output_schema says, with nulls in the malformed rows' places: the
    label and top-k classes, or with `raw` (the model's outputs) each output's values."""
    missing = pa.array(~good) if errors else None

    def lists(values: np.ndarray) -> pa.ListArray:  # (good rows, n) into a list per row
        offsets = np.concatenate([[0], np.cumsum(good * values.shape[1])]).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), values.reshape(-1), mask=missing)

    columns: dict[str, pa.Array] = {"id": batch.column("id")}
    if raw:
        columns |= {name: lists(raw_values(result, name, datatype))
                    for name, datatype, _ in raw}
    else:
        top, scores = top_k(result, int(good.sum()), k)
        label = np.zeros(batch.num_rows, np.int32)
        label[good] = top[:, 0]
        columns |= {"label": pa.array(label, mask=~good if errors else None),
                    "top_labels": lists(top), "top_scores": lists(scores)}
    device = np.full(batch.num_rows, None, object)
    device[good] = result.devices
    columns |= {
        "device": pa.array(device, pa.string()),
        "model_version": pa.array([result.model_version or None] * batch.num_rows,
                                  pa.string())}
    if energy_column:
        joules = np.full(batch.num_rows, np.nan)
        joules[good] = result.joules
        columns[ENERGY_COLUMN] = pa.array(joules, pa.float64(), from_pandas=True)  # NaN: null
    if keep_errors:
        columns["error"] = pa.array([errors.get(i) for i in range(batch.num_rows)],
                                    pa.string())
    return pa.RecordBatch.from_pydict(columns)


def score_batches(batches: Iterator[pa.RecordBatch], options: ScoreOptions
                  ) -> Iterator[pa.RecordBatch]:
    """For mapInArrow (schema: output_schema): scores each batch through this node's daemon,
    a batch's requests running while the next is decoded and sent."""
    decode = decode_images if options.images else decode_tensors
    running: deque[tuple[pa.RecordBatch, np.ndarray, dict[int, str], Future]] = deque()
    address = None
    with ThreadPoolExecutor(2) as pool:  # two batches' calls at most
        for batch in batches:
            if batch.num_rows == 0:
                continue
            address = address or options.locate()
            samples, good, errors = decode(batch, options.model)
            if errors and not options.keep_errors:
                raise ValueError(next(iter(errors.values())))
            running.append((batch, good, errors, pool.submit(options.infer, address, samples)))
            if len(running) > 1:
                yield _finish(*running.popleft(), options)
        while running:
            yield _finish(*running.popleft(), options)


def _finish(batch: pa.RecordBatch, good: np.ndarray, errors: dict[int, str], call: Future,
            options: ScoreOptions) -> pa.RecordBatch:
    result = call.result()
    options.account(result)
    return output_batch(batch, result, good, errors, options.top_k, options.keep_errors,
                        options.energy_column, options.model.outputs if options.raw else ())
