"""Loading: unsupported ops named at load time, the program cache, FPGA binaries' kernel lists,
device choice."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pyopencl as cl
import pytest
from onnx import helper

from accelerators.engine_factory import DeviceSpec, create_engine
from accelerators.onnx_models import make_model
from accelerators.opencl.device import NoSuchDeviceError, OpenCLDevice, find_device, open_device
from accelerators.opencl.engine import OpenCLEngine
from accelerators.opencl.ir import UnsupportedModelError, UnsupportedOpError
from accelerators.opencl.program_cache import MissingKernelsError, ProgramCache
from accelerators.safe_files import UnsafeFolderError
from tests.support.onnx_graphs import single_op, symbolic_conv


def test_an_unsupported_op_is_named_with_its_node_at_load(engine_for) -> None:
    x = np.zeros((1, 4), np.float32)
    model = single_op("Relu", {"x": x}, {}, x.shape)
    model.graph.node[0].output[0] = "r"
    model.graph.node.append(helper.make_node("Hardmax", ["r"], ["y"], name="the_hardmax"))
    with pytest.raises(UnsupportedModelError, match="op 'Hardmax'.*node 'the_hardmax'"):
        engine_for(model)


def test_an_op_is_accepted_where_it_folds_and_refused_where_it_needs_a_kernel(engine_for
                                                                             ) -> None:
    """Hardmax on a constant is evaluated at load; on an activation it would need a kernel."""
    x = np.zeros((1, 4), np.float32)
    model = single_op("Add", {"x": x}, {"k": np.arange(4, dtype=np.float32)[None]}, x.shape)
    model.graph.node[0].input[1] = "h"
    model.graph.node.insert(0, helper.make_node("Hardmax", ["k"], ["h"], name="on_a_constant"))
    got = engine_for(model).run({"x": x}, ["y"])["y"]
    np.testing.assert_array_equal(got, [[0, 0, 0, 1]])


def test_engine_factory_builds_opencl_engines(tmp_path) -> None:
    from tests.support.daemon import MODEL, MODELS
    engine = create_engine(DeviceSpec.parse("opencl:cpu0"), MODELS / MODEL / "1" / "model.onnx")
    assert (engine.device.name, engine.device.kind, engine.device.engine) == (
        "cpu0", "cpu", "opencl")
    assert [t.name for t in engine.inputs] == ["image"] and engine.inputs[0].shape[0] == -1
    with pytest.raises(NoSuchDeviceError, match="no such device: opencl:fpga3"):
        create_engine(DeviceSpec.parse("opencl:fpga3"), MODELS / MODEL / "1" / "model.onnx")


def test_device_specs(opencl_device) -> None:
    assert find_device(opencl_device)[0] == opencl_device
    with pytest.raises(NoSuchDeviceError, match="not of the form"):
        find_device("tpu0")


def test_program_binaries_are_cached_per_device_and_options(tmp_path, opencl_device) -> None:
    dev = open_device(opencl_device)
    cache = ProgramCache(tmp_path)
    cache.program(dev, {"gemm_tile"})
    assert cache.hits == 0 and len(list(tmp_path.glob("*.bin"))) == 1
    again = ProgramCache(tmp_path)
    assert "im2col" in again.program(dev, {"gemm_tile"}).kernel_names
    assert again.hits == 1
    other = ProgramCache(tmp_path, options=again.options + " -DUNUSED=1")
    assert other.key(dev, "src") != again.key(dev, "src")
    other.program(dev, set())
    assert other.hits == 0 and len(list(tmp_path.glob("*.bin"))) == 2
    (next(tmp_path.glob("*.bin"))).write_bytes(b"garbage")  # a bad file is rebuilt
    for c in (ProgramCache(tmp_path), ProgramCache(tmp_path, options=other.options)):
        c.program(dev, {"gemm_tile"})


@pytest.mark.parametrize("planted_by", ["others may write", "another user's"])
def test_a_folder_another_user_could_plant_binaries_in_is_refused(tmp_path, opencl_device,
                                                                  planted_by) -> None:
    dev = open_device(opencl_device)
    folder = tmp_path / "shared"
    folder.mkdir()
    if planted_by == "others may write":
        folder.chmod(0o777)
    elif os.geteuid() == 0:
        os.chown(folder, 65534, 65534)  # nobody's
    else:
        pytest.skip("needs root, to give the folder to another user")
    fpga = OpenCLDevice("fpga0", "fpga", dev.device, dev.context, dev.queue)
    for cache, device, name in ((ProgramCache(folder), dev, "HETSERVE_OPENCL_CACHE_DIR"),
                                (ProgramCache(tmp_path / "cache", binary_dir=folder), fpga,
                                 "HETSERVE_FPGA_BINARIES")):
        with pytest.raises(UnsafeFolderError, match=rf"\${name}\) {folder}: {folder} belongs"):
            cache.program(device, set())
    assert not list(folder.iterdir())  # nothing was read or written there


def test_the_engine_asks_for_the_kernels_of_one_sample_and_of_several(
        tmp_path, opencl_device) -> None:
    """A program is checked at load time for every kernel a batch of any size needs: a fully
    connected layer runs as a split-K GEMV for one sample and as GEMM tiles for more."""
    asked: set[str] = set()

    class Recording(ProgramCache):
        def program(self, dev, required, defines="", board=None):
            asked.update(required)
            return super().program(dev, required, defines, board)

    x, w = np.zeros((1, 1024), np.float32), np.zeros((1024, 16), np.float32)
    model = single_op("Gemm", {"x": x}, {"w": w}, (1, 16))
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(model, str(tmp_path / "fc.onnx"))
    OpenCLEngine(tmp_path / "fc.onnx", opencl_device, cache=Recording(tmp_path / "cache"),
                 local_tiles=False)
    assert {"gemv_partial", "gemm_tile"} <= asked


def test_an_fpga_binary_lacking_kernels_is_named(tmp_path, opencl_device) -> None:
    """The FPGA path loads a precompiled binary; here one built by the device under test from
    a subset of the kernels stands in for a board's .aocx."""
    dev = open_device(opencl_device)
    from importlib import resources
    source = "".join(resources.files("kernels").joinpath(f).read_text()
                     for f in ("common.cl", "elementwise.cl"))
    binary = cl.Program(dev.context, source).build().binaries[0]
    (tmp_path / "board.aocx").write_bytes(binary)
    fpga = OpenCLDevice("fpga0", "fpga", dev.device, dev.context, dev.queue)
    cache = ProgramCache(tmp_path / "cache", binary_dir=tmp_path)
    assert "binary4d" in cache.program(fpga, {"binary4d"}).kernel_names
    with pytest.raises(MissingKernelsError, match=r"lacks kernels \['gemm_tile', 'im2col'\]"):
        cache.program(fpga, {"binary4d", "gemm_tile", "im2col"})
    with pytest.raises(FileNotFoundError, match="HETSERVE_FPGA_BINARIES"):
        ProgramCache(tmp_path / "cache", binary_dir=None).program(fpga, set())


@pytest.mark.parametrize("limits, tile", [
    ((1024, 48 * 1024), 64),  # NVIDIA: 1024 work-items, 48 KiB local memory
    ((1024, 32 * 1024), 32),  # Oclgrind
    ((256, 64 * 1024), 32),  # a 64 x 8 work-group would exceed 256
    ((64, 4 * 1024), 16), ((16, 1024), 8)])
def test_local_tiles_fit_the_device_limits(limits, tile) -> None:
    from accelerators.opencl.launch import LocalTiling
    tiling = LocalTiling.for_device(*limits)
    assert tiling.ts == tile
    assert tiling.ts * tiling.rows <= limits[0]
    assert f"-DTS={tile}" in tiling.defines


def test_tiles_are_built_for_the_device(engine_for, opencl_device) -> None:
    dev = open_device(opencl_device).device
    engine = engine_for(single_op("Relu", {"x": np.zeros((1, 4), np.float32)}, {}, (1, 4)),
                        local_tiles=True)
    from accelerators.opencl.launch import LocalTiling
    expected = LocalTiling.for_device(dev.max_work_group_size, dev.local_mem_size)
    assert engine.build.tiling == expected


def test_symbolic_dims_take_the_served_sizes_or_are_planned_per_shape(
        tmp_path, opencl_device, program_cache) -> None:
    """Fixed by config.pbtxt, or left variable there (or with no config): then planned per
    request shape (test_opencl_shapes.py)."""
    model = symbolic_conv(tmp_path / "conv.onnx")
    x = np.random.default_rng(1).standard_normal((2, 3, 10, 12)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for served, signature in (({"x": (3, 10, 12)}, (-1, 3, 10, 12)),
                              ({"x": (3, 10, -1)}, (-1, 3, 10, -1)), (None, (-1, 3, -1, -1))):
        engine = OpenCLEngine(tmp_path / "conv.onnx", opencl_device, program_cache,
                              served=served)
        assert engine.inputs[0].shape == signature
        np.testing.assert_allclose(engine.run({"x": x}, ["y"])["y"], ref, rtol=1e-4, atol=1e-4)


def test_an_op_the_engine_lacks_is_named_as_such_even_with_variable_dims(tmp_path,
                                                                          opencl_device) -> None:
    """An op the engine lacks (Hardmax) on a sequence of any length: the refusal names the op,
    its node and opset, and gives no advice about sizes, which would not help."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["t", 1, 4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    onnx.save(make_model(helper.make_graph(
        [helper.make_node("Hardmax", ["x"], ["y"], name="hardmax")], "g", [x], [y]), 14),
        tmp_path / "hardmax.onnx")
    with pytest.raises(UnsupportedOpError) as refused:
        OpenCLEngine(tmp_path / "hardmax.onnx", opencl_device)
    assert "op 'Hardmax' (domain 'ai.onnx', opset 14) of node 'hardmax' is not an op of the " \
        "OpenCL engine" in str(refused.value)
    assert "give the dim a size" not in str(refused.value)


def test_an_op_below_its_first_lowered_opset_is_refused_naming_op_node_and_opset(
        tmp_path, opencl_device) -> None:
    """The lowerings are keyed by op and opset range (lowering.LOWERINGS): Resize is lowered
    from opset 11 (its coordinate modes), so opset 10's is refused as an op the engine lacks
    at that opset, whatever the sizes; opset 11's at the same shapes loads."""
    x = np.zeros((1, 2, 3, 3), np.float32)
    scales = np.array([1, 1, 2, 2], np.float32)
    onnx.save(single_op("Resize", {"x": x}, {"scales": scales}, (1, 2, 6, 6), opset=10),
              tmp_path / "resize10.onnx")
    with pytest.raises(UnsupportedOpError) as refused:
        OpenCLEngine(tmp_path / "resize10.onnx", opencl_device)
    assert "op 'Resize' (domain 'ai.onnx', opset 10) of node 'Resize_0': the OpenCL engine " \
        "lowers it from opset 11 on" in str(refused.value)
    onnx.save(single_op("Resize", {"x": x}, {"roi": np.zeros(0, np.float32),
                                             "scales": scales}, (1, 2, 6, 6), opset=11),
              tmp_path / "resize11.onnx")
    assert OpenCLEngine(tmp_path / "resize11.onnx", opencl_device).run(
        {"x": x}, ["y"])["y"].shape == (1, 2, 6, 6)


def test_a_python_error_in_a_lowering_is_a_refusal_naming_the_node(monkeypatch, engine_for
                                                                   ) -> None:
    """Whatever a lowering raises at a shape it cannot take becomes a refusal that names the
    op, node and shapes: the daemon then serves the model on its next device."""
    from accelerators.opencl import lowering

    def broken(lw, node, args):
        return 1 // 0
    monkeypatch.setitem(lowering.LOWERINGS, "Relu", ((1, broken),))
    x = np.zeros((1, 4), np.float32)
    with pytest.raises(UnsupportedModelError, match=r"op 'Relu' of node '.*' \(opset 17\) "
                                                    r"cannot be planned at input shapes "
                                                    r"\[\[1, 4\]\]: ZeroDivisionError"):
        engine_for(single_op("Relu", {"x": x}, {}, x.shape))
