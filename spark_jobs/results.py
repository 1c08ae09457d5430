"""The scored rows, one builder for the mapInArrow and mapInPandas paths: their schema, and
their columns as Arrow arrays (which the pandas path converts). A row gets the label and top-k
classes by softmax score, or, in the raw output mode, every output tensor as it came
(detectors, OCR and segmentation models have no label); then the device that ran it, the model
version, optionally its share of the joules and the reason a malformed row was not scored."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from spark_jobs.client import Inference
from spark_jobs.interface import ModelInterface

ENERGY_COLUMN = "energy_joules"  # a row's share of the joules its request cost
# A raw output column's element type (Spark's, numpy's) by the tensor's datatype; any other
# (FP32, FP16, BF16, unsigned wider than 8 bits) is stored as float.
_RAW_TYPES = {"FP64": ("double", "float64"), "INT64": ("bigint", "int64"),
              "INT32": ("int", "int32"), "INT16": ("smallint", "int16"),
              "INT8": ("tinyint", "int8"), "UINT8": ("smallint", "int16"),
              "BOOL": ("boolean", "bool")}
_FLOAT = ("float", "float32")


def raw_columns(model: ModelInterface) -> list[tuple[str, str]]:
    """(column, Spark element type) of each output in the raw output mode: one flat array
    per row, in the output's row-major order (its shape is the config's dims)."""
    return [(name, _RAW_TYPES.get(datatype, _FLOAT)[0]) for name, datatype, _ in model.outputs]


def output_schema(id_type: str, keep_errors: bool = False, energy_column: bool = False,
                  raw: list[tuple[str, str]] | None = None) -> str:
    """The output rows, keeping the input's id type (a long, or an image's path): the label
    and top-k classes, or with `raw` (raw_columns) every output tensor."""
    scores = ", ".join(f"`{name}` array<{kind}>" for name, kind in raw) if raw else \
        "label int, top_labels array<int>, top_scores array<float>"
    return (f"id {id_type}, {scores}, device string, model_version string"
            + (f", {ENERGY_COLUMN} double" if energy_column else "")
            + (", error string" if keep_errors else ""))


def raw_values(result: Inference, name: str, datatype: str) -> np.ndarray:
    """Output `name` of a call as (samples, values per sample), of its column's type."""
    rows = len(result.devices)
    flat = result.outputs[name].reshape(rows, -1) if rows else np.zeros((0, 0))
    return flat.astype(_RAW_TYPES.get(datatype, _FLOAT)[1], copy=False)


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32)


def top_k(result: Inference, rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best classes (int32, best first) and their softmax scores, per row."""
    # No valid row (all went to the error output) leaves no logits, hence no class axis.
    logits = result.logits.astype(np.float32).reshape(rows, -1) if rows \
        else np.zeros((0, 1), np.float32)
    scores = softmax(logits)
    top = np.argsort(-scores, axis=1, kind="stable")[:, :max(1, k)]
    return top.astype(np.int32), np.take_along_axis(scores, top, axis=1)


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
