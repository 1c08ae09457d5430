"""Loading models onto every device of their `devices` parameter that can run them."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import onnxruntime as ort
import pytest

from service.core.metrics import Metrics
from service.core.registry import ModelRegistry
from service.settings import Settings
from tests.support.daemon import MODEL, MODELS


def _load(tmp_path: Path, devices: str, inspect=lambda registry: None,
          config_extra: str = "") -> ModelRegistry:
    shutil.copytree(MODELS / MODEL, tmp_path / MODEL)
    config = tmp_path / MODEL / "config.pbtxt"
    config.write_text(config.read_text() + config_extra +
                      f'parameters {{ key: "devices" value: {{ string_value: "{devices}" }} }}\n')
    registry = ModelRegistry(Settings(model_repository=tmp_path, unix_socket=None), Metrics())

    async def main() -> None:
        await registry.load_all()
        inspect(registry)
        await registry.close()
    asyncio.run(main())
    return registry


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(),
                    reason="needs a machine where onnxruntime has no GPU")
def test_the_first_device_that_can_run_the_model_serves_it(tmp_path, caplog) -> None:
    # No GPU here: gpu0 is refused with a reason, and cpu0 serves.
    registry = _load(tmp_path, "onnxruntime:gpu0, onnxruntime:cpu0")
    assert not registry.failures
    assert "onnxruntime:gpu0" in caplog.text and "no such device" in caplog.text


def test_unknown_engines_are_reported_naming_the_value(tmp_path) -> None:
    registry = _load(tmp_path, "quantum:qpu0")
    assert "parameters.devices" in registry.failures[MODEL]
    assert "'quantum'" in registry.failures[MODEL]


def test_a_bad_opencl_shapes_parameter_is_reported_naming_it(tmp_path) -> None:
    registry = _load(tmp_path, "onnxruntime:cpu0", config_extra=(
        'parameters { key: "opencl_shapes" value: { string_value: "0" } }\n'))
    assert "parameters.opencl_shapes: '0' is not a positive number" in registry.failures[MODEL]


def test_an_unknown_prefer_order_is_reported_naming_it(tmp_path) -> None:
    registry = _load(tmp_path, "onnxruntime:cpu0", config_extra=(
        'parameters { key: "prefer_order" value: { string_value: "fastest" } }\n'))
    assert "parameters.prefer_order: 'fastest' is unknown; expected one of ['measured', " \
        "'strict']" in registry.failures[MODEL]


def test_every_device_that_can_run_the_model_gets_a_runner(tmp_path, monkeypatch,
                                                           caplog) -> None:
    import tests.support.faulty_engine as faulty
    monkeypatch.setenv(faulty.CONTROL_ENV, str(tmp_path / "control.json"))
    served = []

    def keep(registry: ModelRegistry) -> None:
        model = registry.loaded()[0]
        served.extend(w.device.name for w in model.ranking.runners)
        served.append(model.config.parameters["devices"].string_value)

    registry = _load(tmp_path, "faulty:fpga0, onnxruntime:gpu9, onnxruntime:cpu0", keep)
    assert not registry.failures
    assert served == ["fpga0", "cpu0", "faulty:fpga0, onnxruntime:cpu0"]
    assert "onnxruntime:gpu9" in caplog.text  # the device that cannot, with its reason


def test_instance_group_count_gives_each_device_of_its_kind_that_many_engines(
        tmp_path, monkeypatch) -> None:
    import tests.support.faulty_engine as faulty
    monkeypatch.setenv(faulty.CONTROL_ENV, str(tmp_path / "control.json"))
    threads: list[int] = []
    real = faulty.FaultyEngine.__init__

    def counting(self, spec, path, intra_op_threads):  # the threads each instance was given
        threads.append(intra_op_threads)
        real(self, spec, path, intra_op_threads)
    monkeypatch.setattr(faulty.FaultyEngine, "__init__", counting)
    instances: dict[str, int] = {}

    def keep(registry: ModelRegistry) -> None:
        instances.update({w.device.name: w.instances for w in registry.loaded()[0].ranking.runners})

    # The example config asks for two KIND_CPU instances; an fpga is no KIND_CPU device.
    registry = _load(tmp_path, "faulty:fpga0, faulty:cpu3", keep)
    assert not registry.failures
    assert instances == {"fpga0": 1, "cpu3": 2}
    # The two CPU instances split the cores; the single fpga instance keeps the engine default.
    assert threads == [0] + [max(1, len(os.sched_getaffinity(0)) // 2)] * 2
