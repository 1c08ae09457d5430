"""A model's settings, parsed and validated once from config.pbtxt without a daemon: each bad
parameter named with its value and what is accepted, the typed parts, which devices batch by
buckets, and the configuration the daemon reports back."""

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


def _settings(extra: str = "", **params: str) -> ModelSettings:
    text = CONFIG + extra + "".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
        for k, v in params.items())
    return ModelSettings.parse(text_format.Parse(text, model_config_pb2.ModelConfig()), 1,
                               Path(), max_queue_size=64, node_gpus=0)


def test_defaults_are_filled_in_and_typed() -> None:
    settings = _settings()
    place = settings.placement
    assert [str(d) for d in place.devices] == ["onnxruntime"]
    assert (place.policy, place.prefer_order, place.latency_budget_s) == ("prefer", "measured",
                                                                          0.1)
    assert place.instances.count("cpu") == place.instances.count("gpu") == 1
    assert settings.buckets is not None and settings.buckets.sizes == (1, 2, 4, 8)
    assert settings.bucket_mode == "auto" and settings.opencl_shapes is None
    assert not settings.batching.batching  # no dynamic_batching block
    assert [w.name for w in settings.warmup] == [f"bucket {s}" for s in (1, 2, 4, 8)]


def test_parameters_are_read_with_their_values() -> None:
    settings = _settings('instance_group [ { kind: KIND_CPU count: 3 } ]\n'
                         'dynamic_batching { max_queue_delay_microseconds: 500 }\n',
                         devices="opencl:cpu0, onnxruntime:cpu0", policy="latency",
                         prefer_order="strict", latency_budget_ms="2.5", opencl_shapes="4",
                         batch_buckets="off", precision="fp16")
    place = settings.placement
    assert [str(d) for d in place.devices] == ["opencl:cpu0", "onnxruntime:cpu0"]
    assert (place.policy, place.prefer_order, place.latency_budget_s) == ("latency", "strict",
                                                                          0.0025)
    assert (place.instances.count("cpu"), place.instances.count("gpu")) == (3, 1)
    assert settings.opencl_shapes == 4 and settings.engine.fp16
    assert settings.batching.max_queue_delay_s == 0.0005
    assert settings.buckets_for("gpu") is None  # batch_buckets off


@pytest.mark.parametrize("params, message", [
    ({"policy": "fastest"}, r"model 'm': parameters.policy: 'fastest' is unknown; expected one "
                            r"of \['prefer', 'latency', 'efficiency'\]"),
    ({"prefer_order": "x"}, r"parameters.prefer_order: 'x' is unknown; expected one of "
                            r"\['measured', 'strict'\]"),
    ({"latency_budget_ms": "-5"}, r"parameters.latency_budget_ms: '-5' is not a positive "
                                  "number of milliseconds"),
    ({"batch_buckets": "maybe"}, r"parameters.batch_buckets: 'maybe' is unknown; expected one "
                                 r"of \['auto', 'on', 'off'\]"),
    ({"opencl_shapes": "0"}, r"parameters.opencl_shapes: '0' is not a positive number"),
    ({"devices": "quantum:qpu0"}, r"model 'm': parameters.devices: .*'quantum'"),
    ({"gpu_mem_limit": "lots"}, r"model 'm': parameters.gpu_mem_limit: 'lots' is not a "
                                "positive number of bytes"),
])
def test_a_bad_parameter_fails_the_model_naming_it(params, message) -> None:
    with pytest.raises(ConfigError, match=message):
        _settings(**params)


def test_a_negative_instance_count_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"instance_group count -1 is negative; expected 1 or "
                                          "more engine instances"):
        _settings("instance_group [ { kind: KIND_GPU count: 2 }, { count: -1 } ]")


def test_buckets_by_device_kind_and_cuda_graphs_need_them() -> None:
    auto = _settings()
    assert auto.buckets_for("gpu") == auto.buckets_for("fpga") == auto.buckets
    assert auto.buckets_for("cpu") is None
    assert _settings(batch_buckets="on").buckets_for("cpu") == auto.buckets
    graphs = _settings("optimization { cuda { graphs: true } }", batch_buckets="off")
    with pytest.raises(ConfigError, match=r"optimization.cuda.graphs needs fixed batch shapes"):
        graphs.buckets_for("gpu")
    assert graphs.buckets_for("cpu") is None


def test_the_effective_config_is_rendered_from_the_settings() -> None:
    settings = _settings("dynamic_batching { priority_levels: 2 }", latency_budget_ms="2.5")
    config = settings.effective_config(["onnxruntime:cpu0", "opencl:cpu0"])
    assert {k: v.string_value for k, v in config.parameters.items()} == {
        "devices": "onnxruntime:cpu0, opencl:cpu0", "policy": "prefer",
        "prefer_order": "measured", "latency_budget_ms": "2.5", "batch_buckets": "auto"}
    assert config.dynamic_batching.default_priority_level == 1
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 64
    read = settings.spec.config  # left as it was read
    assert list(read.parameters) == ["latency_budget_ms"]
    assert read.dynamic_batching == model_config_pb2.ModelDynamicBatching(priority_levels=2)
