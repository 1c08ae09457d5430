"""The search space: candidate configs rendered from the shipped one, and the stages' choices."""

from __future__ import annotations

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from accelerators.engine_factory import DeviceSpec
from service.clients.tune import space
from service.clients.tune.space import Candidate
from service.core.model_settings import InstanceGroups
from tests.support.daemon import MODEL, MODELS


def _shipped() -> model_config_pb2.ModelConfig:
    return text_format.Parse((MODELS / MODEL / "config.pbtxt").read_text(),
                             model_config_pb2.ModelConfig())


def test_the_shipped_config_is_read_as_a_candidate_with_the_devices_it_was_served_on() -> None:
    assert space.shipped_candidate(_shipped(), "onnxruntime:cpu0") == Candidate(
        "onnxruntime:cpu0", 2, 500, ())
    assert space.devices_of(_shipped()) == "opencl:fpga0, onnxruntime"  # its `devices`


def test_a_rendered_candidate_keeps_the_rest_of_the_config_and_reads_back_as_itself() -> None:
    candidate = Candidate("opencl:cpu0, onnxruntime:cpu0", 3, 2000, (4, 16))
    config = text_format.Parse(space.render(_shipped(), candidate),
                               model_config_pb2.ModelConfig())
    assert space.shipped_candidate(config, space.devices_of(config)) == candidate
    assert InstanceGroups.parse(config).count("cpu") == 3
    assert (config.max_batch_size, config.input[0].name) == (128, "image")
    unbatched = text_format.Parse(space.render(_shipped(), Candidate("onnxruntime:cpu0", 1,
                                                                     None, ())),
                                  model_config_pb2.ModelConfig())
    assert not unbatched.HasField("dynamic_batching")


def test_devices_are_tried_alone_and_together_only_when_they_are_distinct_devices() -> None:
    best = Candidate("onnxruntime:cpu0", 2, 500, ())
    one_cpu = [DeviceSpec("opencl", "cpu0"), DeviceSpec("onnxruntime", "cpu0")]
    assert [c.devices for c in space.device_stage(best, one_cpu)] == [
        "opencl:cpu0", "onnxruntime:cpu0"]  # two engines on one CPU only compete for it
    gpu_and_cpu = [DeviceSpec("onnxruntime", "gpu0"), DeviceSpec("onnxruntime", "cpu0")]
    assert space.device_stage(best, gpu_and_cpu)[-1].devices == \
        "onnxruntime:gpu0, onnxruntime:cpu0"


def test_queue_delays_stay_well_under_the_p99_bound_and_batch_sizes_under_the_maximum() -> None:
    best = Candidate("onnxruntime:cpu0", 1, None, ())
    assert [c.delay_us for c in space.delay_stage(best, 2.0)] == [0, 100, 500]
    assert [c.delay_us for c in space.delay_stage(best, None)] == list(space.QUEUE_DELAYS_US)
    sets = [c.preferred for c in space.preferred_stage(best, 10)]
    assert sets == [(), (8,), (4,)]  # cut to max_batch_size 10, duplicates dropped
    assert all(c.delay_us == 0 for c in space.preferred_stage(best, 10))  # batching turned on
    assert space.preferred_stage(best, 1) == []
    assert {c.instances for c in space.instance_stage(Candidate("opencl:fpga0", 1, 0, ()))} \
        == {1, 2}
