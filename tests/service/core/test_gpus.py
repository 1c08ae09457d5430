"""Every GPU: `onnxruntime` becomes one device per GPU that the model's instance_group allows, as
Triton reads `instance_group { kind: KIND_GPU gpus: [...] }`; a GPU the node lacks is a load
error. The node's GPU count is given here, so this runs on any machine."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from service.core.model_settings import ModelSettings
from service.errors import ConfigError

CONFIG = '''name: "m" max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
'''


def _devices(groups: str, devices: str, node_gpus: int) -> list[str]:
    config = text_format.Parse(
        CONFIG + groups + f'parameters {{ key: "devices" value: {{ string_value: "{devices}" }} }}',
        model_config_pb2.ModelConfig())
    settings = ModelSettings.parse(config, 1, Path(), max_queue_size=64, node_gpus=node_gpus)
    return [str(d) for d in settings.placement.devices]


def test_onnxruntime_runs_on_every_gpu_or_those_instance_group_lists() -> None:
    assert _devices("", "onnxruntime", 2) == ["onnxruntime:gpu0", "onnxruntime:gpu1"]
    assert _devices("instance_group [ { kind: KIND_GPU count: 2 gpus: [ 2, 0 ] } ]",
                    "opencl:fpga0, onnxruntime, onnxruntime:cpu0", 4) == [
        "opencl:fpga0", "onnxruntime:gpu2", "onnxruntime:gpu0", "onnxruntime:cpu0"]
    assert _devices("", "onnxruntime", 0) == ["onnxruntime"]  # the CPU, then


def test_a_gpu_the_node_lacks_is_a_load_error_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"instance_group\[0\].gpus: GPU 2 is not on this "
                                          r"node; accepted GPU indexes: \[0, 1\]"):
        _devices("instance_group [ { kind: KIND_GPU gpus: [ 2 ] } ]", "onnxruntime", 2)
