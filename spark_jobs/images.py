"""8-bit images (Spark's `image` source rows) to a model's input, as its config says.

A model may set, under `parameters` in config.pbtxt (all optional, strings):
  image_mean, image_std    per-channel values (comma-separated, or one for all channels) applied
                           after scaling pixels to [0, 1]: x = (pixel / 255 - mean) / std;
                           default mean 0, std 1, i.e. pixel / 255
  image_channel_order      "rgb" (default) or "bgr": the order of a 3-channel model's input
The image is converted to the model's channel count (grayscale for 1) and resized (bilinear) to
its height and width."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from PIL import Image

from service import contract
from spark_jobs.client import ModelInterface

# Spark stores pixels as OpenCV does: row-major, channels in BGR(A) order.
_SPARK_MODES = {1: ("L", None), 3: ("RGB", [2, 1, 0]), 4: ("RGBA", [2, 1, 0, 3])}


def _per_channel(model: ModelInterface, key: str, default: float, channels: int) -> np.ndarray:
    text = model.image.get(key, "")
    try:
        values = [float(v) for v in text.split(",")] if text.strip() else [default]
    except ValueError:
        raise ValueError(f"model {model.name!r}: parameters.{key} is {text!r}, "
                         "expected numbers separated by commas") from None
    if len(values) not in (1, channels):
        raise ValueError(f"model {model.name!r}: parameters.{key} has {len(values)} values, "
                         f"1 or {channels} expected")
    return np.asarray(values, np.float32).reshape(-1, 1, 1)


def decode_image(data: bytes, height: int, width: int, channels: int,
                 model: ModelInterface) -> np.ndarray:
    """One image as the model's (C, H, W) input; ValueError says what does not fit."""
    if len(model.input_dims) != 3 or model.input_dims[0] not in (1, 3):
        raise ValueError(f"model {model.name!r} takes {list(model.input_dims)}, "
                         "not a (1 or 3, H, W) image")
    if channels not in _SPARK_MODES or len(data) != height * width * channels:
        raise ValueError(f"{channels} channels of {height}x{width} in {len(data)} bytes "
                         "cannot be read as an 8-bit image")
    c, h, w = model.input_dims
    mode, order = _SPARK_MODES[channels]
    pixels = np.frombuffer(data, np.uint8).reshape(height, width, channels)
    image = Image.fromarray(np.ascontiguousarray(pixels[:, :, order] if order else pixels[:, :, 0]),
                            mode)
    image = image.convert("L" if c == 1 else "RGB")
    if image.size != (w, h):
        image = image.resize((w, h), Image.Resampling.BILINEAR)
    x = np.asarray(image, np.float32).reshape(h, w, c).transpose(2, 0, 1) / 255.0
    if c == 3 and model.image.get("image_channel_order", "rgb").lower() == "bgr":
        x = x[::-1]
    x = (x - _per_channel(model, "image_mean", 0.0, c)) / _per_channel(model, "image_std", 1.0, c)
    return x.astype(contract.served_dtype(model.input_datatype))


def decode_image_rows(rows: Iterable[tuple], samples: np.ndarray,
                      model: ModelInterface) -> dict[int, str]:
    """Decodes Spark `image` rows (origin, height, width, nChannels, data) into `samples`, row i
    into samples[i]; a message per row that does not decode (its slot left as it was)."""
    errors = {}
    for i, (origin, height, width, channels, data) in enumerate(rows):
        try:
            samples[i] = decode_image(data, height, width, channels, model)
        except ValueError as e:
            errors[i] = f"image {origin}: {e}"
    return errors


def tensor_row_error(row_id: object, held: str, model: ModelInterface) -> str:
    """What a `tensor` row of the wrong size is told: `held` says what it holds."""
    return (f"row id {row_id!r}: tensor holds {held}, {int(np.prod(model.input_dims))} "
            f"expected for {model.input_name} {list(model.input_dims)}")
