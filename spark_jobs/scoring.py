"""Scoring as a function over pandas batches, for mapInPandas: decode the tensor column, infer
through the daemon, and return id, label and class scores (softmax of the model's output)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd

from service import tensors
from spark_jobs.client import ModelInterface, infer



def output_schema(id_type: str) -> str:
    """The output rows, keeping the input's id type (a long, or an image's path)."""
    return f"id {id_type}, label int, scores array<float>"


@dataclass(frozen=True)
class ScoreOptions:
    address: str
    model: ModelInterface
    batch_size: int = 128
    inflight: int = 2


def decode_tensors(frame: pd.DataFrame, model: ModelInterface) -> np.ndarray:
    """The `tensor` column (raw bytes or an array of numbers per row) as one (N, *dims) array."""
    dtype = tensors.numpy_dtype(model.input_datatype)
    size = int(np.prod(model.input_dims))
    rows = []
    for row_id, value in zip(frame["id"], frame["tensor"]):
        row = (np.frombuffer(value, dtype) if isinstance(value, (bytes, bytearray))
               else np.asarray(value, dtype))
        if row.size != size:
            raise ValueError(f"row id {row_id!r}: tensor holds {row.size} values, {size} "
                             f"expected for {model.input_name} {list(model.input_dims)}")
        rows.append(row)
    return np.stack(rows).reshape(len(rows), *model.input_dims)


def decode_images(frame: pd.DataFrame, model: ModelInterface) -> np.ndarray:
    """Spark `image` rows (HWC bytes, BGR order) as (N, C, H, W) floats in [0, 1]."""
    samples = []
    for origin, h, w, c, data in zip(frame["id"], frame["height"], frame["width"],
                                     frame["nChannels"], frame["data"]):
        if (c, h, w) != tuple(model.input_dims):
            raise ValueError(f"image {origin}: {c}x{h}x{w} (CxHxW) read, "
                             f"{'x'.join(map(str, model.input_dims))} expected by "
                             f"model {model.name!r}")
        pixels = np.frombuffer(data, np.uint8).reshape(h, w, c)[:, :, ::-1]  # BGR -> RGB
        samples.append(pixels.transpose(2, 0, 1))
    return (np.stack(samples).astype(np.float32) / 255.0).astype(
        tensors.numpy_dtype(model.input_datatype))


def score_frames(frames: Iterator[pd.DataFrame], options: ScoreOptions,
                 images: bool = False) -> Iterator[pd.DataFrame]:
    decode = decode_images if images else decode_tensors
    for frame in frames:
        if frame.empty:
            continue
        logits = infer(options.address, options.model, decode(frame, options.model),
                       options.batch_size, options.inflight).astype(np.float32)
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        scores = shifted / shifted.sum(axis=1, keepdims=True)
        yield pd.DataFrame({"id": frame["id"].to_numpy(),
                            "label": scores.argmax(axis=1).astype(np.int32),
                            "scores": list(scores)})
