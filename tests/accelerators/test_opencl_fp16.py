"""fp16 models (the `precision` parameter, as ONNX Runtime's engine reads it) on the OpenCL
engine: tensors and weights stored as halves on any device (vload_half/vstore_half are core
OpenCL), inputs and outputs FP32. Compared with onnxruntime's FP32 results:
- one op at a time, relative error (largest error over largest magnitude) at most 5e-3: the
  input, the weights and the output are each rounded to half (unit roundoff 2^-11 = 4.9e-4) and
  sums are float, so a result errs by a few units of roundoff of the largest values; 10 units
  leave margin for the longest dot products here (K = 2500);
- the MNIST example, whose logits pass through five rounded tensors: within engine_options'
  fp16 tolerance (5e-2, what the ONNX Runtime engine's fp16 tests allow), the same accuracy on
  the held-out digits within one point.
The half-arithmetic path (-DHALF_COMPUTE, chosen where the device announces cl_khr_fp16) runs
only on such a device: neither PoCL, Oclgrind nor the FPGA emulator announces it, but Intel's CPU
runtime (which comes with the emulator) does, so this module also runs on that device, and the
same source is checked to compile for clang's spir64 target, which has it too."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import onnxruntime as ort
import pytest

from accelerators.engine_factory import DeviceSpec, create_engine
from accelerators.engine_options import TOLERANCE, EngineOptions
from accelerators.opencl.engine import OpenCLEngine
from accelerators.opencl.launch import Build
from accelerators.opencl.program_cache import BUILD_OPTIONS, kernel_source
from tests.support.daemon import MODEL, MODELS
from tests.support.numerics import SMALL_GRID, fresh_rng, rel_err
from tests.support.onnx_graphs import CONV, check_fp16, conv_model, fp32_reference, single_op
from tests.support.opencl_devices import devices_under_test, fp16_device

MNIST = MODELS / MODEL / "1" / "model.onnx"


def _and_half_arithmetic() -> list:
    """The devices under test and, unless one device was named, one with cl_khr_fp16."""
    if os.environ.get("HETSERVE_TEST_OPENCL_DEVICE"):
        return devices_under_test()
    half = fp16_device()
    return [*devices_under_test(), pytest.param(half or "cpu1", marks=pytest.mark.skipif(
        half is None, reason="no device announces cl_khr_fp16 (Intel's CPU runtime, which "
                             "hetserve[fpga-emulator] installs, does)"))]


@pytest.fixture(scope="module", params=_and_half_arithmetic())
def opencl_device(request: pytest.FixtureRequest) -> str:
    return request.param


def _check_mnist(got: np.ndarray, images: np.ndarray, labels: np.ndarray) -> None:
    """fp16 logits of the held-out digits against onnxruntime's FP32: within the fp16
    tolerance, and the accuracy within one point."""
    ref = ort.InferenceSession(str(MNIST), providers=["CPUExecutionProvider"]).run(
        ["logits"], {"image": images})[0]
    assert rel_err(got, ref) <= TOLERANCE["fp16"]
    assert (got.argmax(1) == labels).mean() >= (ref.argmax(1) == labels).mean() - 0.01


@pytest.mark.parametrize("case", CONV[:2] if SMALL_GRID else CONV[:6] + CONV[9:], ids=str)
@pytest.mark.parametrize("local_tiles", [False, True], ids=["registers", "local"])
def test_conv(engine_for, case, local_tiles) -> None:
    x, model, _, seed = conv_model(case, relu=True)
    check_fp16(engine_for, model, {"x": x}, seed, local_tiles)


@pytest.mark.parametrize("m, k, n", [(1, 2500, 37), (8, 300, 130)] if not SMALL_GRID
                         else [(1, 1100, 20), (3, 30, 17)])
@pytest.mark.parametrize("local_tiles", [False, True], ids=["registers", "local"])
def test_gemm(engine_for, m, k, n, local_tiles) -> None:
    rng, seed = fresh_rng()
    x = rng.standard_normal((m, k), np.float32)
    w, b = rng.standard_normal((n, k), np.float32), rng.standard_normal(n).astype(np.float32)
    model = single_op("Gemm", {"x": x}, {"w": w, "b": b}, (m, n), transB=1)
    check_fp16(engine_for, model, {"x": x}, seed, local_tiles)


# (op, input shapes, constant inputs, attributes): every other kernel the fp16 build changes.
OTHERS = [
    ("MaxPool", [(2, 3, 9, 9)], {}, {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ("AveragePool", [(1, 4, 7, 7)], {}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ("GlobalAveragePool", [(2, 5, 4, 4)], {}, {}),
    ("LRN", [(1, 6, 3, 3)], {}, {"size": 3}),
    ("Add", [(2, 3, 4, 5), (3, 1, 1)], {}, {}),
    ("Mul", [(4, 6)], {"c": (6,)}, {}),
    ("HardSwish", [(3, 7)], {}, {}),
    ("Softmax", [(4, 10)], {}, {"axis": -1}),
    ("Concat", [(1, 2, 3, 3), (1, 3, 3, 3)], {}, {"axis": 1}),
    ("Transpose", [(2, 3, 4)], {}, {"perm": [2, 0, 1]}),
    ("Transpose", [(2, 3, 32)], {}, {"perm": [1, 0, 2]}),  # whole vectors: gather_strided_vec
    ("Tanh", [(3, 7)], {}, {}),
    ("MatMul", [(2, 3, 5, 6), (1, 3, 6, 17)], {}, {}),
    ("BatchNormalization", [(2, 3, 4, 4)], {"scale": (3,), "bias": (3,), "mean": (3,),
                                           "var": (3,)}, {}),
    ("LayerNormalization", [(2, 5, 24)], {"scale": (24,), "bias": (24,)}, {}),
    ("InstanceNormalization", [(2, 3, 5, 5)], {"scale": (3,), "bias": (3,)}, {}),
    ("ConvTranspose", [(1, 4, 5, 5)], {"w": (4, 3, 3, 3), "b": (3,)},
     {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
]


OTHER_CASES = OTHERS[:4] if SMALL_GRID else OTHERS


@pytest.mark.parametrize("op, shapes, consts, attrs", OTHER_CASES, ids=[o[0] for o in OTHER_CASES])
def test_other_ops(engine_for, op, shapes, consts, attrs) -> None:
    rng, seed = fresh_rng()
    inputs = {f"x{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    values = {k: (rng.random(s) + 0.5).astype(np.float32) for k, s in consts.items()}
    out = fp32_reference(single_op(op, inputs, values, (1,), **attrs), inputs).shape
    check_fp16(engine_for, single_op(op, inputs, values, out, **attrs), inputs, seed)


def test_tensors_take_half_the_device_memory(opencl_device, program_cache) -> None:
    fp32 = OpenCLEngine(MNIST, opencl_device, program_cache)
    fp16 = OpenCLEngine(MNIST, opencl_device, program_cache, precision="fp16")
    assert fp16.plan(8).peak_bytes * 2 == fp32.plan(8).peak_bytes
    assert [la.kernel for la in fp16.plan(8).launches] == \
        [la.kernel for la in fp32.plan(8).launches]


@pytest.mark.skipif(SMALL_GRID, reason="the whole model is too slow under Oclgrind")
@pytest.mark.parametrize("local_tiles", [False, True], ids=["registers", "local"])
def test_mnist_keeps_its_accuracy(opencl_device, program_cache, holdout, local_tiles) -> None:
    images, labels = holdout
    engine = OpenCLEngine(MNIST, opencl_device, program_cache, local_tiles, precision="fp16")
    _check_mnist(np.concatenate([engine.run({"image": images[i:i + 100]}, ["logits"])["logits"]
                                 for i in range(0, 1000, 100)]), images, labels)


def test_the_precision_option_of_a_model_config_selects_half_storage(opencl_device) -> None:
    spec = DeviceSpec("opencl", opencl_device)
    assert create_engine(spec, MNIST, ort_options=EngineOptions(fp16=True)).build.half
    assert not create_engine(spec, MNIST, ort_options=EngineOptions()).build.half


def test_an_unknown_precision_is_refused(opencl_device, program_cache) -> None:
    with pytest.raises(ValueError, match="precision 'bf16' is unknown"):
        OpenCLEngine(MNIST, opencl_device, program_cache, precision="bf16")


def test_half_arithmetic_where_the_device_has_cl_khr_fp16(opencl_device, program_cache,
                                                          holdout) -> None:
    engine = OpenCLEngine(MNIST, opencl_device, program_cache, local_tiles=True,
                          precision="fp16")
    device = engine.program.devices[0]
    if "cl_khr_fp16" not in device.extensions:
        assert not engine.build.half_compute  # the macro follows the device
        pytest.skip(f"{device.name.strip()} does not announce cl_khr_fp16: half storage only")
    assert "-DHALF_COMPUTE" in engine.build.defines
    images, labels = holdout
    _check_mnist(engine.run({"image": images}, ["logits"])["logits"], images, labels)


@pytest.mark.parametrize("defines", ["-DHALF_STORAGE", "-DHALF_STORAGE -DHALF_COMPUTE"])
def test_the_half_kernels_compile_for_a_target_with_cl_khr_fp16(tmp_path, defines) -> None:
    """clang's spir64 target has cl_khr_fp16, which no device here announces."""
    clang = shutil.which("clang") or shutil.which("clang-15")
    if clang is None:
        pytest.skip("no clang to compile OpenCL C for spir64")
    source = tmp_path / "hetserve.cl"
    source.write_text(kernel_source())
    build = Build()
    result = subprocess.run(
        [clang, "-cl-std=CL1.2", "-Xclang", "-finclude-default-header", "-target", "spir64",
         "-fsyntax-only", "-Werror", *BUILD_OPTIONS.split(), *build.defines.split(),
         "-DTS=32", "-DWPT=8", *defines.split(), str(source)],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
