"""Warm-up batches: Triton's model_warmup as written, else one zero batch per bucket; a warm-up
input that does not fit the model is a load error naming the field."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from service.core.buckets import Buckets
from service.core.model import ModelSpec
from service.core.warmup import warmup_batches
from service.errors import ConfigError

CONFIG = '''name: "m" max_batch_size: 8
input [ { name: "image" data_type: TYPE_FP32 dims: [ 1, 2, 2 ] } ]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ 10 ] } ]
'''


def _spec(extra: str = "") -> ModelSpec:
    return ModelSpec.from_config(
        text_format.Parse(CONFIG + extra, model_config_pb2.ModelConfig()), 1)


def _warmup(inputs: str, batch_size: int = 3, count: int = 2) -> str:
    return (f'model_warmup [ {{ name: "w" batch_size: {batch_size} count: {count} '
            f'inputs {{ key: "image" value: {{ {inputs} }} }} }} ]')


def test_without_model_warmup_every_bucket_gets_zero_batches(tmp_path) -> None:
    batches = warmup_batches(_spec(), Buckets((1, 2, 4, 8)), tmp_path)
    assert [(b.size, b.inputs["image"].shape, b.count) for b in batches] == [
        (n, (n, 1, 2, 2), 2) for n in (1, 2, 4, 8)]


def test_a_model_with_a_free_dim_is_not_warmed_at_a_size_made_up_for_it(tmp_path) -> None:
    """As in Triton: its first requests pay their shapes' first-use cost, and no device is
    dropped for failing a 1x1 image the model never takes."""
    spec = ModelSpec.from_config(text_format.Parse(
        CONFIG.replace("dims: [ 1, 2, 2 ]", "dims: [ 1, -1, -1 ]"),
        model_config_pb2.ModelConfig()), 1)
    assert warmup_batches(spec, Buckets((1, 2, 4, 8)), tmp_path) == []


def test_model_warmup_is_honoured_as_written(tmp_path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "digit").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    spec = _spec(_warmup('data_type: TYPE_FP32 dims: [1, 2, 2] input_data_file: "digit"'))
    [batch] = warmup_batches(spec, Buckets((1, 2, 4, 8)), tmp_path)
    assert (batch.name, batch.size, batch.count) == ("w", 3, 2)
    np.testing.assert_array_equal(batch.inputs["image"],
                                  np.broadcast_to(np.arange(4.0).reshape(1, 2, 2), (3, 1, 2, 2)))


@pytest.mark.parametrize("warmup, message", [
    (_warmup("data_type: TYPE_FP32 dims: [1, 28, 28] zero_data: true"),
     r"model_warmup\[0\] \('w'\): inputs\['image'\].dims \[1, 28, 28\]; expected \[1, 2, 2\]"),
    (_warmup("data_type: TYPE_INT8 dims: [1, 2, 2] zero_data: true"),
     r"inputs\['image'\].data_type TYPE_INT8; expected TYPE_FP32"),
    (_warmup("data_type: TYPE_FP32 dims: [1, 2, 2] zero_data: true", batch_size=9),
     "batch_size 9 is outside 1 to max_batch_size 8"),
    (_warmup('data_type: TYPE_FP32 dims: [1, 2, 2] input_data_file: "absent"'),
     r"input_data_file .*: No such file"),
])
def test_a_warmup_that_does_not_fit_the_model_is_refused(tmp_path, warmup, message) -> None:
    with pytest.raises(ConfigError, match=message):
        warmup_batches(_spec(warmup), Buckets((1, 2, 4, 8)), tmp_path)


@pytest.mark.parametrize("file", ["../../../secret", "/etc/passwd", "sub/../../secret", ""])
def test_an_input_data_file_outside_the_warmup_folder_is_refused(tmp_path, file) -> None:
    model = tmp_path / "models" / "m"
    (model / "warmup").mkdir(parents=True)
    (tmp_path / "secret").write_bytes(np.zeros(4, np.float32).tobytes())  # readable, fits
    spec = _spec(_warmup(f'data_type: TYPE_FP32 dims: [1, 2, 2] input_data_file: "{file}"'))
    with pytest.raises(ConfigError, match=r"model 'm': model_warmup\[0\]\.inputs\['image'\]\."
                                          r"input_data_file .* is not a plain file name; "
                                          "expected the name of a file in the model's warmup/"):
        warmup_batches(spec, Buckets((1, 2, 4, 8)), model)
