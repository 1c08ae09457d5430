"""Images to model input as the model's config says (parameters image_mean/std/channel order)."""

from __future__ import annotations

import numpy as np
import pytest

from spark_jobs.images import decode_image
from spark_jobs.interface import ModelInterface


def _model(channels: int, **image: str) -> ModelInterface:
    return ModelInterface("m", "x", "FP32", (channels, 4, 4), "y", 8, image=image)


def _spark_bgr(rgb: np.ndarray) -> bytes:
    return np.ascontiguousarray(rgb[:, :, ::-1]).tobytes()  # Spark keeps OpenCV's BGR order


def test_default_is_pixels_over_255_in_rgb_order():
    rgb = np.zeros((4, 4, 3), np.uint8)
    rgb[..., 0], rgb[..., 1], rgb[..., 2] = 255, 51, 0
    x = decode_image(_spark_bgr(rgb), 4, 4, 3, _model(3))
    assert x.shape == (3, 4, 4) and x.dtype == np.float32
    np.testing.assert_allclose(x[:, 0, 0], [1.0, 0.2, 0.0], rtol=1e-6)


def test_mean_std_and_bgr_order_from_the_config():
    rgb = np.full((4, 4, 3), 255, np.uint8)
    rgb[..., 2] = 0
    x = decode_image(_spark_bgr(rgb), 4, 4, 3, _model(
        3, image_mean="0.5,0.5,0.25", image_std="0.5", image_channel_order="bgr"))
    np.testing.assert_allclose(x[:, 1, 1], [(0 - 0.5) / 0.5, 1.0, (1 - 0.25) / 0.5], rtol=1e-6)


def test_resized_and_converted_to_the_models_channels():
    gray = np.full((8, 8, 3), 128, np.uint8)
    x = decode_image(gray.tobytes(), 8, 8, 3, _model(1))
    assert x.shape == (1, 4, 4)
    np.testing.assert_allclose(x, 128 / 255, rtol=1e-6)


@pytest.mark.parametrize("image, message", [
    ({"image_std": "a,b"}, "parameters.image_std is 'a,b', expected numbers"),
    ({"image_mean": "1,2"}, "parameters.image_mean has 2 values, 1 or 3 expected")])
def test_bad_parameters_name_the_parameter(image, message):
    with pytest.raises(ValueError, match=message):
        decode_image(bytes(48), 4, 4, 3, _model(3, **image))


def test_truncated_image_is_refused():
    with pytest.raises(ValueError, match="3 channels of 4x4 in 10 bytes"):
        decode_image(bytes(10), 4, 4, 3, _model(3))
