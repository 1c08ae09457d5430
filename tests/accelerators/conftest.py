"""OpenCL fixtures: the devices under test and one program cache for the session. The kernels of
GPUs and CPUs run on PoCL's cpu0 (HETSERVE_TEST_OPENCL_DEVICE names another, e.g. `other0` under
Oclgrind); an FPGA runs its own pipeline, whose tests are test_fpga_*.py on the emulated fpga0
(Intel's FPGA Emulation Platform)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from accelerators.devices import opencl_handles
from accelerators.onnx_models import make_model
from accelerators.opencl.engine import OpenCLEngine
from accelerators.opencl.program_cache import ProgramCache

# The kernel-check target runs under Oclgrind, a slow simulator: a reduced shape grid there.
SMALL_GRID = os.environ.get("HETSERVE_KERNEL_GRID") == "small"
NO_EMULATOR = "no emulated FPGA: Intel's FPGA Emulation Platform (hetserve[fpga-emulator]) is " \
              "not installed here"


def emulated_fpga() -> str | None:
    """`fpga0` where it is the emulator, else None."""
    fpgas = [record for _, record in opencl_handles() if record.kind == "fpga"]
    return "fpga0" if fpgas and fpgas[0].emulated else None


def fp16_device() -> str | None:
    """The first CPU device that announces cl_khr_fp16 (Intel's CPU runtime, which comes with
    the emulator), e.g. `cpu1`; None where none does."""
    cpus = [handle for handle, record in opencl_handles() if record.kind == "cpu"]
    return next((f"cpu{i}" for i, d in enumerate(cpus) if "cl_khr_fp16" in d.extensions), None)


def devices_under_test() -> list:
    return [os.environ.get("HETSERVE_TEST_OPENCL_DEVICE") or "cpu0"]


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


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """Largest absolute error relative to the largest reference magnitude."""
    return float(np.abs(got.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))


def agrees_with_onnxruntime(engine: OpenCLEngine, model: onnx.ModelProto,
                            feeds: dict[str, np.ndarray], tolerance: float) -> None:
    """Every graph output of `engine` has onnxruntime's shape and is within `tolerance`
    (rel_err) of its values, on the same feeds."""
    names = [o.name for o in model.graph.output]
    refs = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(names, feeds)
    got = engine.run(feeds, names)
    for name, ref in zip(names, refs):
        assert got[name].shape == ref.shape, (name, got[name].shape, ref.shape)
        err = rel_err(got[name], ref)
        assert err <= tolerance, f"{name}: relative error {err}"


def fresh_rng(fixed: int | None = None) -> tuple[np.random.Generator, int]:
    """A generator with a new seed each run (failures print it), or `fixed` where a test's
    bound is empirical; $HETSERVE_TEST_SEED overrides both, to reproduce or explore."""
    seed = int(os.environ.get("HETSERVE_TEST_SEED")
               or (fixed if fixed is not None else int.from_bytes(os.urandom(4), "little")))
    return np.random.default_rng(seed), seed


def single_op(op: str, dynamic: dict[str, np.ndarray], consts: dict[str, np.ndarray],
              out_shape: tuple[int, ...], opset: int = 17, **attrs) -> onnx.ModelProto:
    """A one-node model: `dynamic` become graph inputs, `consts` initializers, in the order
    given (dynamic first), feeding `op` whose output is `y`."""
    names = list(dynamic) + list(consts)
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, list(a.shape))
                     for n, a in dynamic.items()],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, list(out_shape))],
        [numpy_helper.from_array(a, n) for n, a in consts.items()])
    return make_model(graph, opset)


def literal_qdq(path) -> ort.InferenceSession:
    """onnxruntime running each QuantizeLinear, DequantizeLinear and fp32 op as written."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def output_step(path, output: str) -> float:
    """The scale of the QuantizeLinear that produces the graph output."""
    model = onnx.load(str(path))
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    dq = next(n for n in model.graph.node if output in n.output)
    return float(consts[dq.input[1]])
