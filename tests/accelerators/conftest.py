"""OpenCL fixtures: the devices under test and one program cache for the session. The kernels of
GPUs and CPUs run on PoCL's cpu0 (HETSERVE_TEST_OPENCL_DEVICE names another, e.g. `other0` under
Oclgrind); an FPGA runs its own pipeline, whose tests are test_fpga_*.py on the emulated fpga0
(Intel's FPGA Emulation Platform)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from accelerators.opencl.engine import OpenCLEngine
from accelerators.opencl.program_cache import ProgramCache
from tests.support.opencl_devices import devices_under_test


@pytest.fixture(scope="session", params=devices_under_test())
def opencl_device(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def program_cache(tmp_path_factory: pytest.TempPathFactory) -> ProgramCache:
    return ProgramCache(tmp_path_factory.mktemp("opencl-cache"))


@pytest.fixture
def engine_for(tmp_path: Path, opencl_device: str, program_cache: ProgramCache):
    """Saves an ONNX model and loads it into an OpenCL engine on the device under test."""
    def load(model: onnx.ModelProto, local_tiles: bool | None = None,
             precision: str = "fp32") -> OpenCLEngine:
        path = tmp_path / f"model{len(list(tmp_path.iterdir()))}.onnx"
        onnx.save(model, str(path))
        return OpenCLEngine(path, opencl_device, program_cache, local_tiles, precision=precision)
    return load
