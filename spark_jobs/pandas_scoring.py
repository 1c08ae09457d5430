"""Scoring over pandas batches (mapInPandas): decode the tensor or image column, infer through
the node-local daemon, and return id, label, top-k classes and scores, the device that ran each
row and the model version, as spark_jobs.arrow_scoring does on Arrow batches. A module of its
own so that Arrow-path workers never import pandas (0.6 s of each Python worker's start)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pandas as pd

from service import contract
from spark_jobs.common_scoring import ENERGY_COLUMN, ScoreOptions, raw_values, top_k
from spark_jobs.images import decode_image_rows, tensor_row_error


def _tensor(value: object, dtype: np.dtype) -> np.ndarray:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return np.frombuffer(value, dtype)
    return np.asarray(value, dtype)


def decode(frame: pd.DataFrame, options: ScoreOptions) -> tuple[np.ndarray, dict[int, str]]:
    """The rows as one (N, *dims) array, and a message per malformed row (by position);
    a malformed row's slot holds zeros."""
    model = options.model
    dtype = contract.served_dtype(model.input_datatype)
    samples = np.zeros((len(frame), *model.input_dims), dtype)
    errors: dict[int, str] = {}
    if options.images:
        return samples, decode_image_rows(zip(
            frame["id"], frame["height"], frame["width"], frame["nChannels"], frame["data"]),
            samples, model)
    size = int(np.prod(model.input_dims))
    for i, (row_id, value) in enumerate(zip(frame["id"], frame["tensor"])):
        row = None if value is None else _tensor(value, dtype)
        if row is None or row.size != size:
            errors[i] = tensor_row_error(row_id, "no tensor" if row is None
                                         else f"{row.size} values", model)
        else:
            samples[i] = row.reshape(model.input_dims)
    return samples, errors


def score_frame(frame: pd.DataFrame, options: ScoreOptions, address: str) -> pd.DataFrame:
    samples, errors = decode(frame, options)
    if errors and not options.keep_errors:
        raise ValueError(next(iter(errors.values())))
    good = np.ones(len(frame), bool)
    good[list(errors)] = False
    result = options.infer(address, samples[good])
    options.account(result)
    if options.raw:
        scores = {name: _spread(list(raw_values(result, name, datatype)), good)
                  for name, datatype, _ in options.model.outputs}
    else:
        top, top_scores = top_k(result, int(good.sum()), options.top_k)
        scores = {"label": pd.array(_spread(top[:, 0].tolist(), good), dtype="Int32"),
                  "top_labels": _spread(list(top), good),
                  "top_scores": _spread(list(top_scores), good)}
    return pd.DataFrame({
        "id": frame["id"].to_numpy(),
        **scores,
        "device": _spread(result.devices, good),
        "model_version": result.model_version or None,
        **({ENERGY_COLUMN: pd.array(_spread(result.joules, good), dtype="Float64")}
           if options.energy_column else {}),  # NaN (not said) and None alike: null
        **({"error": [errors.get(i) for i in range(len(frame))]}
           if options.keep_errors else {})})


def _spread(values: Iterable, good: np.ndarray) -> list:
    """Values for the good rows, in order, with None in the malformed rows' places."""
    it = iter(values)
    return [next(it) if g else None for g in good]


def score_frames(frames: Iterator[pd.DataFrame], options: ScoreOptions
                 ) -> Iterator[pd.DataFrame]:
    """For mapInPandas: scores each batch through this node's daemon."""
    address = None
    for frame in frames:
        if frame.empty:
            continue
        address = address or options.locate()
        yield score_frame(frame, options, address)
